import keras
import pytest


@pytest.fixture
def optimizers_made(monkeypatch):
    """The class names of the Keras optimizers made while the test runs (list, growing):
    `keras.optimizers.Optimizer.__init__` counts each."""
    made = []
    init = keras.optimizers.Optimizer.__init__

    def counting_init(self, *args, **kwargs):
        made.append(type(self).__name__)
        init(self, *args, **kwargs)

    monkeypatch.setattr(keras.optimizers.Optimizer, "__init__", counting_init)
    return made

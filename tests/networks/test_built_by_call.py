"""Networks built by their first call (`BuiltByCall`): the weights Keras' own build gives,
without Keras' symbolic trace of the call."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src import backend as keras_backend

from batchrl import build, configs, environments
from batchrl.networks.built_by_call import BuiltByCall

# Among them every class that takes the mixin: the Gaussian policies (recurrent too), the
# value network, a composite policy of declared torsos per leaf, SAC's twin Q and squashed
# actor, and PQN's Q network and max-Q layer.
CONFIGS = ["pendulum_recurrent", "reach_and_choose", "pendulum_sac", "cartpole_pqn"]


def _built_state(name, folder):
    """Every tensor of the checkpoint (written into `folder`) of `name`'s algorithm as built
    with seed 0: {checkpoint key: array}."""
    config = configs.load(name, {"num_agents": 2, "seed": 0})
    if config.algorithm == "sac":
        config = configs.Config(config, replay_capacity=100)
    batch_env = environments.create_batch(config)
    try:
        agent = build.build(config, batch_env, process_eager=False)
    finally:
        batch_env.close()
    checkpoint = tf.train.Checkpoint(**agent.algo.checkpoint_state)
    reader = tf.train.load_checkpoint(checkpoint.write(str(folder / "ckpt")))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if "OBJECT_GRAPH" not in key}


@pytest.mark.parametrize("name", CONFIGS)
def test_networks_get_keras_weights_without_its_symbolic_trace(name, monkeypatch, tmp_path):
    traced = []
    trace = keras_backend.compute_output_spec

    def counting_trace(*args, **kwargs):
        traced.append(getattr(args[0], "__qualname__", args[0]))
        return trace(*args, **kwargs)

    monkeypatch.setattr(keras_backend, "compute_output_spec", counting_trace)
    ours = _built_state(name, tmp_path / "ours")
    assert traced == []
    monkeypatch.delattr(BuiltByCall, "build")  # Keras' build: trace, then the call.
    keras_built = _built_state(name, tmp_path / "keras")
    assert traced, "Keras traced no call"
    assert ours.keys() == keras_built.keys()
    for key, value in keras_built.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    assert any(np.asarray(value).dtype == np.float32 and np.asarray(value).std() > 0
               for value in ours.values()), "random weights compared"


def test_a_layer_of_the_mixin_is_built_by_its_first_call():
    class Pair(BuiltByCall, keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.first, self.second = keras.layers.Dense(3), keras.layers.Dense(2)

        def call(self, inputs):
            return self.second(self.first(inputs))

    pair = Pair()
    assert pair(np.ones((4, 5), np.float32)).shape == (4, 2)
    assert pair.built and [tuple(v.shape) for v in pair.trainable_variables] == [
        (5, 3), (3,), (3, 2), (2,)]

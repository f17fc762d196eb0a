"""Networks by name: activations and initializers of the hidden layers."""

import gymnasium as gym
import numpy as np
import pytest

from batchrl import configs
from batchrl.networks import NETWORKS


def _networks(name, action_space, **overrides):
    config = configs.load("default", {"policy_layers": [16, 8], "value_layers": [16, 8],
                                      **overrides})
    observation_space = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    return NETWORKS[name](observation_space, action_space, config)


def _hidden_kernels(model):
    return [v.numpy() for v in model.trainable_variables
            if v.ndim == 2 and v.shape[1] in (16, 8) and v.shape[0] in (5, 16)]


@pytest.mark.parametrize("name, space", [
    ("feed_forward_gaussian", gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    ("feed_forward_categorical", gym.spaces.Discrete(3))])
def test_orthogonal_hidden_kernels_have_orthogonal_columns_with_gain_sqrt_2(name, space):
    networks = _networks(name, space, orthogonal_init=True)
    for model in (networks.policy, networks.value):
        kernels = _hidden_kernels(model)
        assert len(kernels) == 2
        for kernel in kernels:
            np.testing.assert_allclose(_gram(kernel), 2.0 * np.eye(min(kernel.shape)),
                                       atol=1e-4)
    plain = _hidden_kernels(_networks(name, space).policy)
    assert not np.allclose(_gram(plain[0]), 2.0 * np.eye(5), atol=0.1)


def _gram(kernel):
    """`W W^T` or `W^T W`, whichever is the smaller: 2 I for an orthogonal kernel of gain
    sqrt(2)."""
    return kernel @ kernel.T if kernel.shape[0] <= kernel.shape[1] else kernel.T @ kernel


def test_tanh_hidden_layers_are_bounded():
    networks = _networks("feed_forward_gaussian", gym.spaces.Box(-1, 1, (2,), np.float32),
                         activation="tanh")
    hidden = networks.policy._hidden(np.full((1, 1, 5), 100.0, np.float32)).numpy()
    assert np.abs(hidden).max() <= 1.0 and np.abs(hidden).max() > 0.5
    relu = _networks("feed_forward_gaussian", gym.spaces.Box(-1, 1, (2,), np.float32))
    assert relu.policy._hidden(np.full((1, 1, 5), 100.0, np.float32)).numpy().max() > 1.0

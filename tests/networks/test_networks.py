"""Networks by name: activations and initializers of the hidden layers."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

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


def test_composite_network_has_one_head_per_action_leaf():
    from batchrl.spaces.nested import FlatActionSpace

    action_space = FlatActionSpace(gym.spaces.Dict({
        "bits": gym.spaces.MultiBinary(3),
        "choices": gym.spaces.MultiDiscrete([2, 4]),
        "kind": gym.spaces.Discrete(3, start=1),
        "move": gym.spaces.Box(-2.0, 2.0, (2,), np.float32)}))
    networks = _networks("feed_forward_composite", action_space)
    params, _ = networks.policy(np.ones((2, 3, 5), np.float32), np.zeros((2, 0), np.float32))
    assert {key: tuple(value.shape) for key, value in params.items()} == {
        "leaf0_logits": (2, 3, 3), "leaf1_logits": (2, 3, 2, 4), "leaf2_logits": (2, 3, 1, 3),
        "leaf3_mean": (2, 3, 2), "leaf3_logstd": (2, 3, 2)}
    # The first choice has 2 actions: the others have probability 0.
    np.testing.assert_array_equal(params["leaf1_logits"].numpy()[..., 0, 2:], -1e9)
    distribution = networks.distribution(params)
    action = distribution.sample(tf.random.Generator.from_seed(0)).numpy()
    assert action.shape == (2, 3, 3 + 2 + 1 + 2)
    assert (action[..., 3] <= 1).all() and (action[..., 4] <= 3).all()
    # Small output layers: close to uniform choices at first.
    np.testing.assert_allclose(distribution.parts[2].entropy().numpy(), np.log(3), atol=0.05)
    with pytest.raises(ValueError, match="use feed_forward_categorical"):
        _networks("feed_forward_composite", gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="use feed_forward_composite"):
        _networks("feed_forward_gaussian", action_space)


@pytest.mark.parametrize("name, space", [
    ("feed_forward_gaussian", gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    ("recurrent_gaussian", gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    ("feed_forward_categorical", gym.spaces.Discrete(3)),
    ("feed_forward_composite", "nested")])
def test_a_checkpoint_of_the_networks_alone_restores_every_weight(name, space, tmp_path):
    if space == "nested":  # Several heads: a list of layers, like the hidden layers.
        from batchrl.spaces.nested import FlatActionSpace
        space = FlatActionSpace(gym.spaces.Tuple((gym.spaces.Discrete(3),
                                                  gym.spaces.Box(-1, 1, (2,), np.float32))))
    saved = _networks(name, space)
    path = tf.train.Checkpoint(policy=saved.policy, value=saved.value).save(tmp_path / "ckpt")
    restored = _networks(name, space)
    status = tf.train.Checkpoint(policy=restored.policy, value=restored.value).restore(path)
    status.assert_consumed()
    for model in ("policy", "value"):
        before = getattr(saved, model).weights
        after = getattr(restored, model).weights
        assert len(after) == len(before) >= 3
        for old, new in zip(before, after, strict=True):
            np.testing.assert_array_equal(new.numpy(), old.numpy(), err_msg=new.path)


@pytest.mark.parametrize("name, action_space", [
    ("feed_forward_gaussian", gym.spaces.Box(-1, 1, (2,), np.float32)),
    ("recurrent_gaussian", gym.spaces.Box(-1, 1, (2,), np.float32)),
    ("feed_forward_categorical", gym.spaces.Discrete(3)),
    ("feed_forward_composite", gym.spaces.Box(-1, 1, (2,), np.float32)),
])
@pytest.mark.parametrize("orthogonal", [False, True])
def test_presets_are_built_from_their_declared_layers(name, action_space, orthogonal):
    from batchrl import networks
    from batchrl.networks import spec as network_spec

    config = configs.load("default", {"policy_layers": [12, 8], "value_layers": [6],
                                      "activation": "tanh", "orthogonal_init": orthogonal})
    declared = networks.preset_layers(name, config)
    assert declared["policy"] == network_spec.check_layers(declared["policy"])
    built = NETWORKS[name](gym.spaces.Box(-1, 1, (3,), np.float32), action_space, config)
    recurrent = name == "recurrent_gaussian"
    policy_mlp = built.policy._encoder if recurrent else built.policy._hidden
    for mlp, layers in ((policy_mlp, declared["policy"]),
                        (built.value._hidden, declared["value"])):
        dense = [spec for spec in layers if spec["type"] == "dense"]
        assert len(mlp._dense) == len(dense)
        for layer, spec in zip(mlp._dense, dense, strict=True):
            assert layer.units == spec["units"]
            assert layer.activation.__name__ == spec["activation"] == "tanh"
            kind = type(layer.kernel_initializer).__name__
            assert kind == ("Orthogonal" if orthogonal else "GlorotUniform")
    if recurrent:
        assert declared["policy"][-1] == {"type": "gru", "units": 8}
        assert built.policy.state_size == 8
    else:
        assert [spec["units"] for spec in declared["policy"]] == [12, 8]


@pytest.mark.parametrize("batch_dims", [1, 2])
def test_mlp_flattens_the_axes_after_the_batch_and_applies_its_layers(batch_dims):
    """The one MLP of the policies (`[batch, time, ...]`) and of the off-policy algorithms'
    networks (`[batch, ...]`), against NumPy."""
    from batchrl.networks.mlp import MLP, dense_layers

    mlp = MLP(dense_layers([4, 3], "tanh"), batch_dims)
    observ = np.random.default_rng(0).normal(size=(2, 5)[:batch_dims] + (2, 3))
    output = mlp(observ.astype(np.float32)).numpy()
    hidden = observ.reshape(observ.shape[:batch_dims] + (6,))
    for layer in mlp._dense:
        hidden = np.tanh(hidden @ layer.kernel.numpy() + layer.bias.numpy())
    assert output.shape == observ.shape[:batch_dims] + (3,)
    np.testing.assert_allclose(output, hidden, rtol=1e-5, atol=1e-6)

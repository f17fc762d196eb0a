"""Declared networks and preprocessing: the config checks (batchrl.networks.spec) and the
layers they build (batchrl.networks.torso)."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.networks import spec as network_spec
from batchrl.networks.torso import Torso

CONV = [{"type": "conv2d", "filters": 4, "kernel": 3}, {"type": "flatten"},
        {"type": "dense", "units": 8}]


def _image(shape=(10, 10, 3), high=255):
    return gym.spaces.Box(0, high, shape, np.uint8)


def _torso(layers, preprocessing=(), space=None):
    return Torso(network_spec.check_layers(list(layers)),
                 network_spec.check_preprocessing(list(preprocessing)),
                 space if space is not None else _image())


def test_check_fills_in_every_default():
    checked = network_spec.check_layers(CONV + [{"type": "max_pool2d"}])
    assert checked[0] == {"type": "conv2d", "filters": 4, "kernel": [3, 3], "stride": [1, 1],
                          "padding": "valid", "activation": "config",
                          "initializer": "config"}
    assert checked[3] == {"type": "max_pool2d", "size": [2, 2], "stride": None,
                          "padding": "valid"}
    assert network_spec.check_preprocessing([{"type": "scale"}]) == [
        {"type": "scale", "factor": "space"}]
    assert network_spec.check_preprocessing([]) == []


def test_a_checked_config_loads_again_unchanged():
    """The network and preprocessing of a loaded config, with their filled-in defaults
    ("config", "space"), are accepted as they are (e.g. passed on to another config)."""
    loaded = configs.load("image_and_cue")
    again = configs.load("default", {"network": loaded.network,
                                     "preprocessing": loaded.preprocessing})
    assert again.network == loaded.network and again.preprocessing == loaded.preprocessing
    assert loaded.network["leaves"]["image"][0]["activation"] == "config"


@pytest.mark.parametrize("layers, message", [
    ([], "non-empty list"),
    ("conv", "non-empty list"),
    ([{"units": 3}], "layer 1: expected a mapping with a type"),
    ([{"type": "dense", "units": 3}, {"type": "conv3d"}], "layer 2: unknown type 'conv3d'"),
    ([{"type": "dense", "units": 3, "size": 2}], r"layer 1 \(dense\): unknown key 'size'"),
    ([{"type": "conv2d", "filters": 3}], r"layer 1 \(conv2d\): missing key 'kernel'"),
    ([{"type": "conv2d", "filters": 3, "kernel": [3, 3, 3]}], "key 'kernel' must be"),
    ([{"type": "dense", "units": 0}], "key 'units' must be an integer >= 1"),
    ([{"type": "dense", "units": 3, "activation": "softplus"}], "choices: relu"),
    ([{"type": "conv2d", "filters": 3, "kernel": 2, "padding": "full"}], "choices: valid"),
])
def test_bad_layers_are_one_line_errors_naming_the_layer(layers, message):
    with pytest.raises(configs.ConfigError, match=message) as caught:
        network_spec.check_layers(layers)
    assert "\n" not in str(caught.value)


def test_the_config_keys_are_checked_when_the_config_loads():
    config = configs.load("default", {"network": CONV, "preprocessing": [{"type": "scale"}]})
    assert config.network[0]["kernel"] == [3, 3]
    assert config.preprocessing == [{"type": "scale", "factor": "space"}]
    with pytest.raises(configs.ConfigError, match="'network', layer 2: unknown type"):
        configs.load("default", {"network": [{"type": "flatten"}, {"type": "dropout"}]})
    with pytest.raises(configs.ConfigError, match="'preprocessing', step 1 .crop.: missing"):
        configs.load("default", {"preprocessing": [{"type": "crop", "top": 0}]})


@pytest.mark.parametrize("layers, shape", [
    ([{"type": "conv2d", "filters": 4, "kernel": 3}], (8, 8, 4)),
    ([{"type": "conv2d", "filters": 4, "kernel": [3, 2], "stride": 2, "padding": "same"}],
     (5, 5, 4)),
    ([{"type": "max_pool2d"}], (5, 5, 3)),
    ([{"type": "max_pool2d", "size": 3, "stride": 1}], (8, 8, 3)),
    ([{"type": "layer_norm"}], (10, 10, 3)),
    ([{"type": "activation", "function": "tanh"}], (10, 10, 3)),
    ([{"type": "flatten"}], (300,)),
    ([{"type": "dense", "units": 7}], (10, 10, 7)),
])
def test_each_layer_type_gives_its_output_shape(layers, shape):
    torso = _torso(layers + [{"type": "flatten"}])
    layer = torso._merged._declared[0]
    assert tuple(layer.compute_output_shape((1, 10, 10, 3))[1:]) == shape
    assert torso.output_size == int(np.prod(shape))
    output = torso(np.zeros((2, 3, 10, 10, 3), np.uint8))
    assert output.shape == (2, 3, np.prod(shape)) and output.dtype == tf.float32


@pytest.mark.parametrize("steps, shape", [
    ([{"type": "scale"}], (10, 10, 3)),
    ([{"type": "grayscale"}], (10, 10, 1)),
    ([{"type": "resize", "height": 6, "width": 4}], (6, 4, 3)),
    ([{"type": "crop", "top": 1, "left": 2, "height": 5, "width": 7}], (5, 7, 3)),
])
def test_each_preprocessing_step_gives_its_output_shape(steps, shape):
    torso = _torso([{"type": "flatten"}], steps)
    assert torso.output_size == int(np.prod(shape))


def test_scale_maps_pixels_to_the_unit_interval_and_grayscale_weighs_the_channels():
    frames = np.zeros((1, 1, 10, 10, 3), np.uint8)
    frames[..., 0] = 255
    scaled = _torso([{"type": "flatten"}], [{"type": "scale"}])(frames).numpy()
    np.testing.assert_allclose(scaled.reshape(10, 10, 3)[..., 0], 1.0)
    np.testing.assert_allclose(scaled.reshape(10, 10, 3)[..., 1:], 0.0)
    gray = _torso([{"type": "flatten"}], [{"type": "grayscale"}, {"type": "scale"}])(frames)
    np.testing.assert_allclose(gray.numpy(), 0.299, rtol=1e-5)
    # A binary frame (a bool Box, uint8 in the batch) keeps its 0 / 1.
    binary = _torso([{"type": "flatten"}], [{"type": "scale"}], _image((4, 4, 2), high=1))
    np.testing.assert_array_equal(binary(np.ones((1, 1, 4, 4, 2), np.uint8)).numpy(), 1.0)


@pytest.mark.parametrize("layers, steps, space, message", [
    (CONV, [], gym.spaces.Box(-1, 1, (5,), np.float32),
     r"network layer 1 \(conv2d\) needs an image \[height, width, channels\], got an input "
     r"of shape \(5,\)"),
    ([{"type": "flatten"}, {"type": "max_pool2d"}], [], None,
     r"network layer 2 \(max_pool2d\) needs an image"),
    ([{"type": "conv2d", "filters": 4, "kernel": 11}, {"type": "flatten"}], [], None,
     r"network layer 1 \(conv2d\) (does not fit|leaves nothing of) its input of shape "
     r"\(10, 10, 3\)"),
    ([{"type": "conv2d", "filters": 4, "kernel": 3}], [], None,
     r"last layer gives shape \(8, 8, 4\); end the list with a vector"),
    ([{"type": "flatten"}], [{"type": "crop", "top": 5, "left": 0, "height": 6, "width": 2}],
     None, r"preprocessing step 1 \(crop\) reaches outside the image"),
    ([{"type": "flatten"}], [{"type": "grayscale"}], gym.spaces.Box(-1, 1, (4,), np.float32),
     r"preprocessing step 1 \(grayscale\) needs an image"),
])
def test_a_network_that_does_not_fit_the_observation_names_the_layer(
        layers, steps, space, message):
    with pytest.raises(ValueError, match=message) as caught:
        _torso(layers, steps, space)
    assert "\n" not in str(caught.value)


def test_a_conv_network_checkpoint_restores_every_weight(tmp_path):
    from batchrl import networks

    config = configs.load("default", {"network": CONV, "preprocessing": [{"type": "scale"}]})
    space = gym.spaces.Discrete(4)

    def build():
        return networks.constructor(config.network)(_image(), space, config)

    saved = build()
    path = tf.train.Checkpoint(policy=saved.policy, value=saved.value).save(tmp_path / "ckpt")
    restored = build()
    tf.train.Checkpoint(policy=restored.policy, value=restored.value).restore(
        path).assert_consumed()
    frames = np.random.default_rng(0).integers(0, 256, (2, 1, 10, 10, 3)).astype(np.uint8)
    for model in ("policy", "value"):
        before, after = getattr(saved, model).weights, getattr(restored, model).weights
        assert len(after) == len(before) >= 6  # conv, dense and head kernels and biases
        for old, new in zip(before, after, strict=True):
            np.testing.assert_array_equal(new.numpy(), old.numpy(), err_msg=new.path)
    empty = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(restored.policy(frames, empty)[0]["logits"].numpy(),
                                  saved.policy(frames, empty)[0]["logits"].numpy())


def test_shared_layers_are_one_copy_in_both_networks():
    from batchrl import networks

    def build(share):
        config = configs.load("default", {"network": CONV, "share_layers": share})
        return networks.constructor(config.network)(_image(), gym.spaces.Discrete(4), config)

    shared, separate = build(True), build(False)
    assert shared.policy._hidden is shared.value._hidden
    common = {id(v) for v in shared.policy.trainable_variables} & {
        id(v) for v in shared.value.trainable_variables}
    assert len(common) == 4  # The conv and dense kernels and biases.
    assert not {id(v) for v in separate.policy.trainable_variables} & {
        id(v) for v in separate.value.trainable_variables}


def test_preprocessing_and_shared_layers_need_declared_layers():
    from batchrl import build

    for key, value in (("preprocessing", [{"type": "scale"}]), ("share_layers", True)):
        config = configs.load("cartpole", {key: value})
        with pytest.raises(configs.ConfigError, match=f"'{key}' needs a network of declared"):
            build.check(config)


DICT = gym.spaces.Dict({"cue": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                        "image": gym.spaces.Box(0, 255, (8, 8, 1), np.uint8),
                        "kind": gym.spaces.Discrete(3)})
LEAVES = {"leaves": {"image": [{"type": "conv2d", "filters": 4, "kernel": 3},
                               {"type": "flatten"}, {"type": "dense", "units": 6}],
                     "cue": [{"type": "dense", "units": 5}]},
          "layers": [{"type": "dense", "units": 7}]}


def _leaf_torso(network, preprocessing=None):
    from batchrl.spaces.nested import FlatObservationSpace

    return Torso(network_spec.check_network(network),
                 network_spec.check_preprocessing(preprocessing or {}),
                 FlatObservationSpace(DICT))


def test_each_listed_leaf_has_its_own_layers_before_the_merge():
    torso = _leaf_torso(LEAVES, {"image": [{"type": "scale"}]})
    assert torso.output_size == 7
    sizes = [(size, chain.output_size if chain else None) for _, size, chain in torso._parts]
    assert sizes == [(2, 5), (64, 6), (3, None)]  # "kind" enters one-hot, as it is.
    assert torso._merged._declared[0].kernel.shape == (5 + 6 + 3, 7)
    flat = np.zeros((2, 3, 2 + 64 + 3), np.float32)
    assert torso(flat).shape == (2, 3, 7)
    # The image leaf sees its own pixels, in its own shape: only they change its output.
    image = torso._leaf_image
    pixels = np.random.default_rng(0).integers(0, 256, (1, 8, 8, 1)).astype(np.float32)
    flat[0, 0, 2:66] = pixels.reshape(-1)
    # Outputs of about 0.1 from unseeded weights; one may come near 0, where float32's
    # different summation orders leave an absolute difference of ~1e-8.
    np.testing.assert_allclose(torso(flat)[0, 0], torso._merged(tf.concat(
        [tf.zeros([1, 5]), image(pixels), tf.zeros([1, 3])], -1))[0], rtol=1e-5, atol=1e-6)


def test_a_tuple_observation_names_its_entries_by_index():
    from batchrl.spaces.nested import FlatObservationSpace

    space = gym.spaces.Tuple((gym.spaces.Box(0, 255, (8, 8, 1), np.uint8),
                              gym.spaces.Box(-1.0, 1.0, (2,), np.float32)))
    network = network_spec.check_network({"leaves": {0: LEAVES["leaves"]["image"]},
                                          "layers": [{"type": "dense", "units": 7}]})
    torso = Torso(network, network_spec.check_preprocessing({0: [{"type": "scale"}]}),
                  FlatObservationSpace(space))
    assert [(size, chain.output_size if chain else None)
            for _, size, chain in torso._parts] == [(64, 6), (2, None)]
    assert torso(np.zeros((1, 1, 66), np.float32)).shape == (1, 1, 7)
    with pytest.raises(ValueError, match="name '2', which the observation does not have; "
                                         "its keys: 0, 1"):
        Torso(network_spec.check_network({"leaves": {2: [{"type": "flatten"}]}}), {},
              FlatObservationSpace(space))


@pytest.mark.parametrize("network, preprocessing, message", [
    ({**LEAVES, "leaves": {"cue": [{"type": "conv2d", "filters": 2, "kernel": 1}]}}, None,
     r"network leaf 'cue' layer 1 \(conv2d\) needs an image"),
    ({"leaves": {"sound": [{"type": "flatten"}]}}, None,
     "network leaves name 'sound', which the observation does not have; its keys: cue, "
     "image, kind"),
    (LEAVES, {"kind": [{"type": "scale"}]},
     "preprocessing names 'kind', which the network does not list among its leaves"),
    (LEAVES, [{"type": "scale"}], "give preprocessing per leaf too"),
])
def test_leaves_that_do_not_fit_the_observation_are_named(network, preprocessing, message):
    with pytest.raises(ValueError, match=message):
        _leaf_torso(network, preprocessing)


@pytest.mark.parametrize("network, message", [
    ({"leaves": {"image": []}}, "config key 'network', leaf 'image' must be a non-empty list"),
    ({"leaves": {"image": [{"type": "flatten"}]}, "merge": "add"}, "merge is 'add'"),
    ({"leaves": {"image": [{"type": "flatten"}]}, "trunk": []}, "unknown key 'trunk'"),
    ({"layers": [{"type": "flatten"}]}, "leaves must map observation keys"),
])
def test_a_bad_mapping_of_leaves_is_a_config_error(network, message):
    with pytest.raises(configs.ConfigError, match=message):
        configs.load("default", {"network": network})


def test_a_mapping_of_leaves_needs_a_dict_observation():
    with pytest.raises(ValueError, match="network lists leaves .image, cue., but the "
                                         "observation space .* is not a Dict"):
        Torso(network_spec.check_network(LEAVES), [], _image())


def test_channels_last_puts_the_frames_of_envpool_atari_last():
    torso = _torso([{"type": "conv2d", "filters": 2, "kernel": 8, "stride": 4},
                    {"type": "flatten"}], [{"type": "channels_last"}, {"type": "scale"}],
                   gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
    assert torso._merged._declared[0].kernel.shape == (8, 8, 4, 2)  # 4 input channels.
    frames = np.zeros((1, 1, 4, 84, 84), np.uint8)
    frames[0, 0, 3] = 255  # Only the newest frame is lit.
    conv = torso._merged._declared[0]
    expected = conv(np.transpose(frames[0], (0, 2, 3, 1)).astype(np.float32) / 255.0)
    np.testing.assert_allclose(torso(frames)[0, 0], tf.reshape(expected, [-1]), rtol=1e-5)


@pytest.mark.parametrize("network, message", [
    ([{"type": "gru", "units": 4}, {"type": "dense", "units": 3}],
     r"layer 1 \(gru\): a recurrent layer must be the last of the list, and the only one"),
    ([{"type": "lstm", "units": 4}, {"type": "gru", "units": 3}], "layer 1 .lstm.: a recurrent"),
    ({"leaves": {"image": [{"type": "flatten"}, {"type": "gru", "units": 3}]}},
     "leaf 'image': a recurrent layer goes last in the layers after the merge"),
])
def test_a_misplaced_recurrent_layer_is_a_config_error(network, message):
    with pytest.raises(configs.ConfigError, match=message):
        configs.load("default", {"network": network})


def test_a_declared_recurrent_policy_keeps_its_state_and_exports_with_it(tmp_path):
    import batchrl

    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(configs.ConfigError, match="share_layers needs feed-forward layers"):
        batchrl.Agent.create("default", space, gym.spaces.Discrete(2), num_envs=2,
                             max_length=20, share_layers=True,
                             network=[{"type": "dense", "units": 8},
                                      {"type": "gru", "units": 5}])
    agent = batchrl.Agent.create(
        "default", space, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), num_envs=2,
        max_length=20, network=[{"type": "dense", "units": 8}, {"type": "lstm", "units": 5}])
    observation = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    first = agent.act(observation, deterministic=True)
    second = agent.act(observation, deterministic=True)
    assert not np.allclose(first, second), "the same observation, another state"
    model = tf.saved_model.load(str(agent.export(tmp_path / "model")))
    serve = model.signatures["serving_default"]
    state = tf.zeros([2, 10])  # An LSTM's h and c, 5 units each.
    out = serve(observation=tf.constant(observation), state=state)
    np.testing.assert_allclose(out["action"].numpy(), first, atol=1e-5)
    again = serve(observation=tf.constant(observation), state=out["state"])
    np.testing.assert_allclose(again["action"].numpy(), second, atol=1e-5)
    agent.close()


def test_a_normalize_step_normalizes_only_the_entries_that_list_it():
    from batchrl import build, environments
    from batchrl.spaces.nested import FlatObservationSpace, leaves

    config = configs.load("image_and_cue", {
        "normalize_observ": False, "num_agents": 2,
        "preprocessing": {"cue": [{"type": "normalize"}], "image": [{"type": "scale"}]}})
    batch_env = environments.create_batch(config)
    try:
        built = build.build(config, batch_env, process_eager=False)
    finally:
        batch_env.close()
    space = built.batch_env.observation_space
    assert isinstance(space, FlatObservationSpace)
    observ_filter = built.algo.checkpoint_state["observ_filter"]
    cue = [path[0] == "cue" for path, leaf in leaves(space.space)
           for _ in range(gym.spaces.flatdim(leaf))]
    assert 0 < sum(cue) < len(cue)
    np.testing.assert_array_equal(observ_filter._mask, cue)
    assert observ_filter._center and observ_filter._scale  # Normalizing, where the mask says.


@pytest.mark.parametrize("steps, message", [
    ([{"type": "scale"}, {"type": "normalize"}], "make it the first step"),
    ([{"type": "frame_stack", "frames": 2}, {"type": "normalize"}], None),
])
def test_normalize_comes_first_or_after_frame_stack(steps, message):
    if message is None:
        assert network_spec.plan(network_spec.check_preprocessing(steps)).normalized is True
    else:
        with pytest.raises(configs.ConfigError, match=message):
            network_spec.check_preprocessing(steps)


def test_a_normalize_step_and_normalize_observ_are_one_or_the_other():
    from batchrl import build

    config = configs.load("image_and_cue", {
        "normalize_observ": True, "preprocessing": {"cue": [{"type": "normalize"}]}})
    with pytest.raises(configs.ConfigError, match="choose one"):
        build.check(config)


def test_the_plan_puts_each_step_on_its_floor():
    """`spec.plan`: `frame_stack` to the batch of environments, `normalize` to the acting
    half's filter, the rest to the network in its order; per `Dict` entry the same, with
    only the entries that have a stack or a normalization named."""
    steps = network_spec.check_preprocessing([
        {"type": "frame_stack", "frames": 4}, {"type": "normalize"},
        {"type": "scale", "factor": 0.5}, {"type": "grayscale"}])
    frames, normalized, network = network_spec.plan(steps)
    assert (frames, normalized) == (4, True)
    assert [step["type"] for step in network] == ["scale", "grayscale"]
    assert network[0]["factor"] == 0.5
    assert network_spec.plan([]) == (None, None, [])
    mapped = network_spec.check_preprocessing({
        "image": [{"type": "frame_stack", "frames": 2}, {"type": "scale"}],
        "position": [{"type": "normalize"}]})
    frames, normalized, network = network_spec.plan(mapped)
    assert frames == {"image": 2} and normalized == {"position"}
    assert {key: [step["type"] for step in value] for key, value in network.items()} == {
        "image": ["scale"], "position": []}

"""The preprocessing steps by value (`batchrl.networks.torso`), against NumPy: `crop` is the
slice it names, `resize` to half the size averages 2 x 2 blocks, `scale` and `grayscale` are
their formulas; and layers or steps of zero size are one-line config errors naming them
(`batchrl.networks.spec`)."""

import gymnasium as gym
import numpy as np
import pytest

from batchrl import configs
from batchrl.networks import spec as network_spec
from batchrl.networks.torso import Torso

LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R BT.601, as docs/pixels.md says.


def _preprocessed(steps, image, space):
    """What the preprocessing `steps` make of one `image`, flattened (a `Torso` whose only
    layer is a flatten)."""
    torso = Torso(network_spec.check_layers([{"type": "flatten"}]),
                  network_spec.check_preprocessing(steps), space)
    return torso(image[None, None])[0, 0].numpy()


def test_crop_is_the_numpy_slice_it_names():
    image = np.arange(6 * 8 * 2).reshape(6, 8, 2).astype(np.uint8)  # Every pixel differs.
    space = gym.spaces.Box(0, 255, image.shape, np.uint8)
    cropped = _preprocessed(
        [{"type": "crop", "top": 1, "left": 2, "height": 3, "width": 5}], image, space)
    np.testing.assert_array_equal(cropped, image[1:4, 2:7].reshape(-1))


def test_resize_to_half_the_size_averages_two_by_two_blocks():
    # Bilinear with half-pixel centers (tf.image.resize): output pixel (i, j) samples the
    # input at (2 i + 0.5, 2 j + 0.5), the middle of the block of rows 2i, 2i+1 and columns
    # 2j, 2j+1, where the interpolation is the block's mean.
    image = np.random.default_rng(0).uniform(-5, 5, (8, 6, 3)).astype(np.float32)
    space = gym.spaces.Box(-5.0, 5.0, image.shape, np.float32)
    resized = _preprocessed([{"type": "resize", "height": 4, "width": 3}], image, space)
    blocks = image.reshape(4, 2, 3, 2, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(resized, blocks.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("step, factor", [
    ({"type": "scale"}, 1.0 / 255.0),  # Default: 1 / the space's upper bound.
    ({"type": "scale", "factor": 0.25}, 0.25),
])
def test_scale_multiplies_by_its_factor(step, factor):
    image = np.random.default_rng(1).integers(0, 256, (4, 5, 3)).astype(np.uint8)
    space = gym.spaces.Box(0, 255, image.shape, np.uint8)
    np.testing.assert_allclose(_preprocessed([step], image, space),
                               image.reshape(-1) * factor, rtol=1e-6)


def test_grayscale_weighs_each_pixels_channels_by_the_luma_weights():
    image = np.random.default_rng(2).integers(0, 256, (4, 5, 6)).astype(np.uint8)  # 2 frames.
    space = gym.spaces.Box(0, 255, image.shape, np.uint8)
    expected = (image.reshape(4, 5, 2, 3) * LUMA).sum(-1)
    np.testing.assert_allclose(_preprocessed([{"type": "grayscale"}], image, space),
                               expected.reshape(-1), rtol=1e-5)


def test_steps_apply_in_their_order():
    image = np.random.default_rng(3).integers(0, 256, (10, 12, 3)).astype(np.uint8)
    space = gym.spaces.Box(0, 255, image.shape, np.uint8)
    steps = [{"type": "crop", "top": 2, "left": 0, "height": 8, "width": 10},
             {"type": "resize", "height": 4, "width": 5}, {"type": "grayscale"},
             {"type": "scale"}]
    cropped = image[2:10, 0:10].astype(np.float64)
    halved = cropped.reshape(4, 2, 5, 2, 3).mean(axis=(1, 3))
    expected = (halved * LUMA).sum(-1) / 255.0
    np.testing.assert_allclose(_preprocessed(steps, image, space), expected.reshape(-1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("network, preprocessing, where, message", [
    ([{"type": "conv2d", "filters": 4, "kernel": 0}], [], "'network', layer 1 (conv2d)",
     "key 'kernel' must be a positive integer or a list of two, got 0"),
    ([{"type": "flatten"}, {"type": "conv2d", "filters": 4, "kernel": [3, 0]}], [],
     "'network', layer 2 (conv2d)",
     "key 'kernel' must be a positive integer or a list of two, got [3, 0]"),
    ([{"type": "conv2d", "filters": 4, "kernel": 3, "stride": 0}], [],
     "'network', layer 1 (conv2d)",
     "key 'stride' must be a positive integer or a list of two, got 0"),
    ([{"type": "conv2d", "filters": 0, "kernel": 3}], [], "'network', layer 1 (conv2d)",
     "key 'filters' must be an integer >= 1, got 0"),
    ([{"type": "max_pool2d", "size": 0}], [], "'network', layer 1 (max_pool2d)",
     "key 'size' must be a positive integer or a list of two, got 0"),
    ([{"type": "max_pool2d", "stride": [0, 1]}], [], "'network', layer 1 (max_pool2d)",
     "key 'stride' must be a positive integer or a list of two, got [0, 1]"),
    ([{"type": "dense", "units": 0}], [], "'network', layer 1 (dense)",
     "key 'units' must be an integer >= 1, got 0"),
    ([{"type": "gru", "units": 0}], [], "'network', layer 1 (gru)",
     "key 'units' must be an integer >= 1, got 0"),
    ([{"type": "flatten"}], [{"type": "resize", "height": 0, "width": 4}],
     "'preprocessing', step 1 (resize)", "key 'height' must be an integer >= 1, got 0"),
    ([{"type": "flatten"}], [{"type": "scale"}, {"type": "resize", "height": 4, "width": 0}],
     "'preprocessing', step 2 (resize)", "key 'width' must be an integer >= 1, got 0"),
    ([{"type": "flatten"}], [{"type": "crop", "top": 0, "left": 0, "height": 0, "width": 4}],
     "'preprocessing', step 1 (crop)", "key 'height' must be an integer >= 1, got 0"),
    ([{"type": "flatten"}], [{"type": "crop", "top": 0, "left": 0, "height": 4, "width": 0}],
     "'preprocessing', step 1 (crop)", "key 'width' must be an integer >= 1, got 0"),
    ([{"type": "flatten"}], [{"type": "crop", "top": -1, "left": 0, "height": 4, "width": 4}],
     "'preprocessing', step 1 (crop)", "key 'top' must be an integer >= 0, got -1"),
    ([{"type": "flatten"}], [{"type": "frame_stack", "frames": 0}],
     "'preprocessing', step 1 (frame_stack)", "key 'frames' must be an integer >= 1, got 0"),
    ([{"type": "flatten"}], [{"type": "scale", "factor": 0}],
     "'preprocessing', step 1 (scale)", "key 'factor' must be a positive number, got 0"),
])
def test_a_zero_size_is_a_one_line_config_error_naming_the_layer(
        network, preprocessing, where, message):
    with pytest.raises(configs.ConfigError) as caught:
        configs.load("default", {"network": network, "preprocessing": preprocessing})
    assert str(caught.value) == f"config key {where}: {message}"

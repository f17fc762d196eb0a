"""The hidden part of a declared network: in-graph preprocessing of the observation, then
the declared layers (`batchrl.network_spec` checks both lists)."""

import math

import keras
import numpy as np
import tensorflow as tf

_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601, as tf.image.rgb_to_grayscale.


def _initializer(name):
    if name == "orthogonal":
        return keras.initializers.Orthogonal(gain=math.sqrt(2))
    return name


def _layer(spec, defaults):
    """The Keras layer of one checked layer spec; `defaults` fills `activation` and
    `initializer` where the spec says "config"."""
    spec = {key: defaults.get(key, value) if value == "config" else value
            for key, value in spec.items()}
    kind = spec["type"]
    if kind == "dense":
        return keras.layers.Dense(spec["units"], activation=spec["activation"],
                                  kernel_initializer=_initializer(spec["initializer"]))
    if kind == "conv2d":
        return keras.layers.Conv2D(
            spec["filters"], tuple(spec["kernel"]), strides=tuple(spec["stride"]),
            padding=spec["padding"], activation=spec["activation"],
            kernel_initializer=_initializer(spec["initializer"]))
    if kind == "max_pool2d":
        return keras.layers.MaxPooling2D(tuple(spec["size"]),
                                         strides=tuple(spec["stride"] or spec["size"]),
                                         padding=spec["padding"])
    if kind == "flatten":
        return keras.layers.Flatten()
    if kind == "layer_norm":
        return keras.layers.LayerNormalization()
    return keras.layers.Activation(spec["function"])


def _preprocess(spec, observation_space):
    """The function `[n, *shape] -> [n, *shape']` (float32) of one checked step."""
    kind = spec["type"]
    if kind == "scale":
        factor = spec["factor"]
        if factor == "space":
            high = float(np.max(observation_space.high))
            factor = 1.0 / high if np.isfinite(high) and high > 0 else 1.0
        return lambda x: tf.cast(x, tf.float32) * factor
    if kind == "grayscale":
        return lambda x: tf.reduce_sum(tf.cast(x, tf.float32) * _LUMA, -1, keepdims=True)
    if kind == "resize":
        size = (spec["height"], spec["width"])
        return lambda x: tf.image.resize(tf.cast(x, tf.float32), size)
    top, left, height, width = (spec[key] for key in ("top", "left", "height", "width"))
    return lambda x: tf.cast(x[:, top:top + height, left:left + width], tf.float32)


def _needs_image(spec):
    return spec["type"] in ("conv2d", "max_pool2d", "grayscale", "resize", "crop")


class Torso(keras.layers.Layer):
    """Preprocessing and declared layers applied to each step: `[batch, time, *shape]` ->
    float32 `[batch, time, features]`.

    Args:
      layers: checked layer specs (`network_spec.check_layers`).
      preprocessing: checked preprocessing steps (`network_spec.check_preprocessing`).
      observation_space: the `Box` of one observation (its shape; its bound for `scale`).
      activation: the default activation (config key `activation`).
      orthogonal: the default initializer is orthogonal (config key `orthogonal_init`),
        else Glorot uniform.

    Raises:
      ValueError: a layer or a step that does not fit the shape it receives (an image
        layer on a vector, a kernel larger than its input, a crop outside the image), or
        layers that do not end in a vector; the message names the layer by position and
        type.
    """

    def __init__(self, layers, preprocessing, observation_space, activation="relu",
                 orthogonal=False, name="hidden"):
        super().__init__(name=name)
        defaults = {"activation": activation,
                    "initializer": "orthogonal" if orthogonal else "glorot_uniform"}
        self._steps = [_preprocess(spec, observation_space) for spec in preprocessing]
        self._declared = [_layer(spec, defaults) for spec in layers]
        for index, layer in enumerate(self._declared):  # Tracked for checkpoints.
            setattr(self, f"_layer{index}", layer)
        self._observ_shape = tuple(observation_space.shape)
        self.output_size = self._check(layers, preprocessing)

    def _check(self, layers, preprocessing):
        """Runs one zero observation through the steps and layers (building the layers);
        returns the size of the output vector."""
        value = tf.zeros((1,) + self._observ_shape, tf.float32)
        named = ([("preprocessing step", spec, step) for spec, step in zip(
            preprocessing, self._steps, strict=True)]
            + [("network layer", spec, layer) for spec, layer in zip(
                layers, self._declared, strict=True)])
        counts = {}
        for noun, spec, function in named:
            counts[noun] = counts.get(noun, 0) + 1
            shape = tuple(value.shape[1:])
            where = f"{noun} {counts[noun]} ({spec['type']})"
            if _needs_image(spec) and len(shape) != 3:
                raise ValueError(f"{where} needs an image [height, width, channels], got an "
                                 f"input of shape {shape}")
            if spec["type"] == "crop" and (spec["top"] + spec["height"] > shape[0]
                                           or spec["left"] + spec["width"] > shape[1]):
                raise ValueError(f"{where} reaches outside the image of shape {shape}")
            try:
                value = function(value)
            except (ValueError, tf.errors.InvalidArgumentError) as error:
                first = str(error).strip().splitlines()[0]
                raise ValueError(f"{where} does not fit its input of shape {shape}: "
                                 f"{first}") from None
            if 0 in tuple(value.shape[1:]):
                raise ValueError(f"{where} leaves nothing of its input of shape {shape} "
                                 f"(output {tuple(value.shape[1:])})")
        if len(value.shape) != 2:
            raise ValueError(f"the network's last layer gives shape {tuple(value.shape[1:])}; "
                             f"end the list with a vector (a flatten, then dense layers)")
        return int(value.shape[-1])

    def call(self, observ):
        observ = tf.convert_to_tensor(observ)
        leading = tf.shape(observ)[:2]
        hidden = tf.reshape(observ, (-1,) + self._observ_shape)
        for step in self._steps:
            hidden = step(hidden)
        hidden = tf.cast(hidden, tf.float32)
        for layer in self._declared:
            hidden = layer(hidden)
        result = tf.reshape(hidden, tf.concat([leading, [self.output_size]], 0))
        result.set_shape(observ.shape[:2].concatenate([self.output_size]))
        return result

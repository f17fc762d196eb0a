"""The hidden part of a declared network: in-graph preprocessing of the observation, then
the declared layers (`batchrl.networks.spec` checks both lists)."""

import contextlib
import math

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from batchrl.networks import spec as network_spec
from batchrl.networks.built_by_call import BuiltByCall
from batchrl.networks.recurrence import unroll

_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma weights.


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
    """The function `[n, *shape] -> [n, *shape']` of one checked step: float32, but
    `channels_last` keeps its input's dtype (the layers receive float32 either way)."""
    kind = spec["type"]
    if kind == "scale":
        factor = spec["factor"]
        if factor == "space":
            high = float(np.max(observation_space.high))
            factor = 1.0 / high if np.isfinite(high) and high > 0 else 1.0
        return lambda x: tf.cast(x, tf.float32) * factor
    if kind == "grayscale":
        return _grayscale
    if kind == "resize":
        size = (spec["height"], spec["width"])
        return lambda x: tf.image.resize(tf.cast(x, tf.float32), size)
    if kind == "channels_last":
        return lambda x: tf.transpose(x, [0, 2, 3, 1])
    top, left, height, width = (spec[key] for key in ("top", "left", "height", "width"))
    return lambda x: tf.cast(x[:, top:top + height, left:left + width], tf.float32)


def _grayscale(images):
    """`[n, h, w, 3 k]` RGB (k frames stacked on the channels) -> float32 `[n, h, w, k]`."""
    images = tf.cast(images, tf.float32)
    channels = images.shape[-1]
    if channels % 3:
        raise ValueError(f"grayscale needs RGB channels (3, or 3 per stacked frame), got "
                         f"{channels}")
    frames = tf.reshape(images, tf.concat([tf.shape(images)[:-1], [channels // 3, 3]], 0))
    return tf.reduce_sum(frames * _LUMA, -1)


def _needs_image(spec):
    return spec["type"] in ("conv2d", "max_pool2d", "grayscale", "resize", "crop",
                            "channels_last")


class _Chain(BuiltByCall, keras.layers.Layer):
    """Preprocessing steps, then layers, on `[n, *shape]`, ending in float32 `[n, size]`
    (`output_size`); built and checked on a zero input when constructed (see `Torso`).
    `where` names it in the messages (e.g. "network leaf 'image'")."""

    def __init__(self, layers, preprocessing, space, defaults, where="network", name="chain"):
        super().__init__(name=name)
        # The steps of the network's floor (`spec.plan`): the observation arrives stacked
        # and normalized.
        preprocessing = network_spec.plan(preprocessing).network
        self._steps = [_preprocess(spec, space) for spec in preprocessing]
        self._declared = [_layer(spec, defaults) for spec in layers]
        for index, layer in enumerate(self._declared):  # Tracked for checkpoints.
            setattr(self, f"_layer{index}", layer)
        self._shape = tuple(space.shape)
        self.output_size = self._check(layers, preprocessing, where)

    def _check(self, layers, preprocessing, where):
        value = tf.zeros((1,) + self._shape, tf.float32)
        named = ([("preprocessing step", spec, step) for spec, step in zip(
            preprocessing, self._steps, strict=True)]
            + [("layer", spec, layer) for spec, layer in zip(
                layers, self._declared, strict=True)])
        counts = {}
        for noun, spec, function in named:
            counts[noun] = counts.get(noun, 0) + 1
            shape = tuple(value.shape[1:])
            name = f"{where} {noun} {counts[noun]} ({spec['type']})"
            if _needs_image(spec) and len(shape) != 3:
                raise ValueError(f"{name} needs an image [height, width, channels], got an "
                                 f"input of shape {shape}")
            if spec["type"] == "crop" and (spec["top"] + spec["height"] > shape[0]
                                           or spec["left"] + spec["width"] > shape[1]):
                raise ValueError(f"{name} reaches outside the image of shape {shape}")
            try:
                value = function(value)
            except (ValueError, tf.errors.InvalidArgumentError) as error:
                first = str(error).strip().splitlines()[0]
                raise ValueError(f"{name} does not fit its input of shape {shape}: "
                                 f"{first}") from None
            if 0 in tuple(value.shape[1:]):
                raise ValueError(f"{name} leaves nothing of its input of shape {shape} "
                                 f"(output {tuple(value.shape[1:])})")
        if len(value.shape) != 2:
            raise ValueError(f"{where}: the last layer gives shape {tuple(value.shape[1:])}; "
                             f"end the list with a vector (a flatten, then dense layers)")
        return int(value.shape[-1])

    def call(self, value):
        for step in self._steps:
            value = step(value)
        value = tf.cast(value, tf.float32)
        for layer in self._declared:
            value = layer(value)
        return value


class Torso(BuiltByCall, keras.layers.Layer):
    """Preprocessing and declared layers applied to each step: `[batch, time, *shape]` ->
    float32 `[batch, time, features]`.

    For a list of layers, the observation goes through `preprocessing` and the layers. For
    a mapping (`{leaves, merge, layers}`, a `Dict` or `Tuple` observation flattened as
    `batchrl.spaces.nested.FlatObservationSpace`; a `Tuple`'s entries named by their indices
    from 0), each listed entry of the observation is
    cut out of the flat vector, given its own shape, and goes through its preprocessing
    (`preprocessing[KEY]`) and layers; the other entries stay flat; all are concatenated
    in the observation's order and go through `layers`.

    Args:
      layers: checked layers (`batchrl.networks.spec.check_network`).
      preprocessing: checked preprocessing (`batchrl.networks.spec.check_preprocessing`).
      observation_space: the `Box` of one observation (its shape; its bound for `scale`),
        or the `FlatObservationSpace` of a `Dict` or a `Tuple`.
      activation: the default activation (config key `activation`).
      orthogonal: the default initializer is orthogonal (config key `orthogonal_init`),
        else Glorot uniform.

    Raises:
      ValueError: a layer or a step that does not fit the shape it receives (an image
        layer on a vector, a kernel larger than its input, a crop outside the image), or
        layers that do not end in a vector; a mapping of leaves for an observation that is
        neither a `Dict` nor a `Tuple`, or naming a key it does not have; preprocessing of
        another form than the layers'. The message names the leaf, and the layer by
        position and type.
    """

    def __init__(self, layers, preprocessing, observation_space, activation="relu",
                 orthogonal=False, name="hidden"):
        super().__init__(name=name)
        defaults = {"activation": activation,
                    "initializer": "orthogonal" if orthogonal else "glorot_uniform"}
        self._observ_shape = tuple(observation_space.shape)
        if isinstance(layers, list):
            if isinstance(preprocessing, dict):
                raise ValueError("preprocessing maps observation keys to steps, but the "
                                 "network is one list of layers: list the steps instead")
            self._parts = None
            self._merged = _Chain(layers, preprocessing, observation_space, defaults,
                                  name="chain")
        else:
            self._parts = self._leaf_chains(layers, preprocessing, observation_space,
                                            defaults)
            size = sum(chain.output_size if chain else part_size
                       for _, part_size, chain in self._parts)
            merged_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
            self._merged = _Chain(layers["layers"], [], merged_space, defaults,
                                  "network (after the merge)", name="merged")
        self.output_size = self._merged.output_size
        self._outputs = _Outputs()

    @contextlib.contextmanager
    def reused(self):
        """Within this context, a call on an observation tensor that an earlier call inside
        it took returns that call's output: the policy and the value network of
        `share_layers` then run the layers once (forward, and backward for one loss of
        both), not once each."""
        self._outputs.by_input = {}
        try:
            yield
        finally:
            self._outputs.by_input = None

    def _leaf_chains(self, layers, preprocessing, observation_space, defaults):
        """`(offset, size, chain or None)` of each entry of the `Dict` or `Tuple`
        observation (a `Tuple`'s entries named by their indices)."""
        space = getattr(observation_space, "space", None)
        if isinstance(space, gym.spaces.Dict):
            entries = list(space.spaces.items())
        elif isinstance(space, gym.spaces.Tuple):
            entries = list(enumerate(space.spaces))
        else:
            raise ValueError(f"network lists leaves ({', '.join(map(str, layers['leaves']))}), "
                             f"but the observation space {observation_space} is not a Dict "
                             f"or a Tuple")
        preprocessing = preprocessing or {}
        if not isinstance(preprocessing, dict):
            raise ValueError("the network lists leaves: give preprocessing per leaf too "
                             "({KEY: [steps]})")
        listed = {str(key): value for key, value in layers["leaves"].items()}
        steps = {str(key): value for key, value in preprocessing.items()}
        keys = [str(key) for key, _ in entries]
        for what, names in (("network leaves", listed), ("preprocessing", steps)):
            unknown = sorted(set(names) - set(keys))
            if unknown:
                raise ValueError(f"{what} name {unknown[0]!r}, which the observation does "
                                 f"not have; its keys: {', '.join(keys)}")
        parts, offset = [], 0
        for key, leaf in entries:
            size = gym.spaces.flatdim(leaf)
            chain = None
            if str(key) in listed:
                leaf_space = leaf if isinstance(leaf, gym.spaces.Box) else gym.spaces.Box(
                    0.0, 1.0, (size,), np.float32)
                chain = _Chain(listed[str(key)], steps.get(str(key), []), leaf_space,
                               defaults, f"network leaf {key!r}", name=f"leaf_{key}")
                setattr(self, f"_leaf_{key}", chain)
            elif str(key) in steps:
                raise ValueError(f"preprocessing names {key!r}, which the network does not "
                                 f"list among its leaves")
            parts.append((offset, size, chain))
            offset += size
        return parts

    def call(self, observ):
        observ = tf.convert_to_tensor(observ)
        outputs = self._outputs.by_input
        if outputs is not None and observ.ref() in outputs:
            return outputs[observ.ref()]
        leading = tf.shape(observ)[:2]
        flat = tf.reshape(observ, (-1,) + self._observ_shape)
        if self._parts is None:
            hidden = self._merged(flat)
        else:
            pieces = []
            for offset, size, chain in self._parts:
                piece = flat[:, offset:offset + size]
                if chain is not None:
                    piece = chain(tf.reshape(piece, (-1,) + chain._shape))
                pieces.append(tf.cast(piece, tf.float32))
            hidden = self._merged(tf.concat(pieces, -1))
        result = tf.reshape(hidden, tf.concat([leading, [self.output_size]], 0))
        result.set_shape(observ.shape[:2].concatenate([self.output_size]))
        if outputs is not None:
            outputs[observ.ref()] = result
        return result


class _Outputs:
    """`Torso.reused`'s outputs by input (`by_input`, None outside it); a plain object, so
    that neither Keras nor checkpoints track the tensors it holds."""

    by_input = None


class RecurrentTorso(BuiltByCall, keras.layers.Layer):
    """A feed-forward `Torso`, then a recurrent layer over the time axis:
    `(observ [batch, time, *shape], state [batch, state_size])` -> `(float32 [batch, time,
    units], state)`; with `reset` (bool `[batch, time]`), the state is zeroed before the
    steps where it is True (`recurrence.unroll`).

    Args:
      torso: the `Torso` of the layers before the recurrent one.
      spec: the checked `gru` or `lstm` layer (`batchrl.networks.spec.RECURRENT`).

    Attributes:
      state_size: `units` for a GRU; `2 * units` for an LSTM, whose state is its `h` and
        `c` side by side.
      output_size: `units`.
    """

    def __init__(self, torso, spec, name="hidden"):
        super().__init__(name=name)
        self._torso = torso
        units = int(spec["units"])
        self._lstm = spec["type"] == "lstm"
        cell = keras.layers.LSTMCell(units) if self._lstm else keras.layers.GRUCell(units)
        self._rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True,
                                     name=spec["type"])
        self.state_size = 2 * units if self._lstm else units
        self.output_size = units

    def call(self, observ, state, reset=None):
        hidden = self._torso(observ)
        if reset is not None:  # Episodes begin inside the rows (`recurrence.unroll`).
            return unroll(self._rnn.cell, hidden, state, reset, self._lstm)
        if self._lstm:
            h, c = tf.split(state, 2, axis=-1)
            outputs, h, c = self._rnn(hidden, initial_state=[h, c])
            return outputs, tf.concat([h, c], -1)
        outputs, state = self._rnn(hidden, initial_state=state)
        return outputs, state

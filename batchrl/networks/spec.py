"""Declared networks and preprocessing: the checks of the config keys `network` (a list of
layers) and `preprocessing` (a list of steps), free of TensorFlow so that configs load fast.

A layer or a step is a mapping with a `type` and that type's keys; `check_network` and
`check_preprocessing` fill in the defaults and return what `batchrl.networks.torso` builds.

For a `Dict` or `Tuple` observation, `network` may instead be a mapping
`{leaves: {KEY: [layers], ...}, merge: concatenate, layers: [layers]}`: each listed entry of
the observation (a key of the `Dict`, an index from 0 of the `Tuple`) goes through its own
layers, the others enter as
they are (flattened), all are concatenated in the observation's order, then `layers`
follow (may be empty); and `preprocessing` a mapping `{KEY: [steps]}`.

Layers (applied to one step's observation after the preprocessing):
- `dense`: `units`; `activation`, `initializer`.
- `conv2d`: `filters`, `kernel` (int or [height, width]); `stride` (1), `padding` (`valid`
  or `same`), `activation`, `initializer`. Takes `[height, width, channels]`.
- `max_pool2d`: `size` (2); `stride` (the size), `padding`. Takes `[height, width,
  channels]`.
- `flatten`: makes the input one vector.
- `layer_norm`: normalizes the last axis (Ba et al., arXiv:1607.06450), with a learned
  scale and offset.
- `activation`: `function`.
- `gru`, `lstm`: `units`; a recurrent layer over the steps of an episode (Cho et al.,
  arXiv:1406.1078; Hochreiter and Schmidhuber 1997), the last of the list and the only
  one. The policy keeps its state (LSTM: h and c side by side) per agent, zero when an
  episode begins, and PPO trains it on chunks replayed from the stored states; the value
  network stays feed-forward, with a dense layer of as many units in its place.
`activation` is one of `ACTIVATIONS` (default: the config key `activation`); `initializer`
of the kernels is `orthogonal` (gain sqrt 2, Saxe et al., arXiv:1312.6120), `glorot_uniform`
or `he_uniform` (default: the config key `orthogonal_init` chooses the first or second).

Preprocessing steps (in the graph, before the layers; part of an exported model):
- `scale`: float32 times `factor` (default: 1 / the observation space's upper bound, so
  uint8 pixels land in [0, 1] and binary frames stay 0 / 1).
- `frame_stack`: `frames` (at least 2); the first step of a list (of the observation, or
  of a `Box` entry of a `Dict` / `Tuple` observation): the batch of environments keeps
  each agent's last `frames` observations (of the entry), joined on the last axis (`[h, w,
  c]` to `[h, w, frames * c]`, the oldest first; a new episode's first observation fills
  them all), in the graph (`batchrl.environments.frame_stack`). The memories and an
  exported model hold the stacked observations.
- `normalize`: the streaming normalization of `normalize_observ` (running mean and
  standard deviation, clipped to `observ_clip`), first (after `frame_stack`) in a list, or
  in the list of each `Dict` entry to normalize (the others are left as they are). The
  algorithm applies it before storing observations (float32 then) and in the exported
  model; instead of `normalize_observ: true`, which normalizes every entry but an action
  mask or one-hot elements.
- `grayscale`: `[h, w, 3]` RGB to `[h, w, 1]` (ITU-R BT.601 luma weights), or stacked RGB
  frames `[h, w, 3 k]` to `[h, w, k]`.
- `resize`: to `height` x `width` (bilinear with half-pixel centers, `tf.image.resize`
  without antialiasing: halving a side averages pairs of pixels, 2 x 2 blocks for both).
- `crop`: `top`, `left`, `height`, `width`: the rows `top` ... `top + height - 1` and the
  columns `left` ... `left + width - 1` (NumPy's `image[top:top + height, left:left +
  width]`).
Sizes, kernels, strides and unit counts are at least 1 (`top`, `left` at least 0).
- `channels_last`: `[channels, h, w]` to `[h, w, channels]` (EnvPool's Atari frames are
  `[4, 84, 84]`; the layers take channels last).
"""

import collections

from batchrl.errors import ConfigError

ACTIVATIONS = ("relu", "tanh", "elu", "gelu", "swish", "sigmoid", "linear")
INITIALIZERS = ("orthogonal", "glorot_uniform", "he_uniform")
PADDINGS = ("valid", "same")

# Each type's keys: required keys map to None, optional ones to their default ("config":
# the config key of the same concept decides).
LAYERS = {
    "dense": {"units": None, "activation": "config", "initializer": "config"},
    "conv2d": {"filters": None, "kernel": None, "stride": 1, "padding": "valid",
               "activation": "config", "initializer": "config"},
    "max_pool2d": {"size": 2, "stride": None, "padding": "valid"},
    "flatten": {},
    "layer_norm": {},
    "activation": {"function": None},
    "gru": {"units": None},
    "lstm": {"units": None},
}
RECURRENT = ("gru", "lstm")
PREPROCESSING = {
    "frame_stack": {"frames": None},
    "normalize": {},
    "scale": {"factor": "space"},
    "grayscale": {},
    "resize": {"height": None, "width": None},
    "crop": {"top": None, "left": None, "height": None, "width": None},
    "channels_last": {},
}
# Keys whose None default means "derived" (max_pool2d's stride: its size).
_OPTIONAL_NONE = {"max_pool2d": ("stride",)}


MERGES = ("concatenate",)


def check_network(value):
    """The checked value of config key `network` when it declares layers: a list
    (`check_layers`) or a mapping of `leaves`, `merge` and `layers` (see the module
    docstring), with defaults filled in.

    Raises:
      ConfigError: as `check_layers`, naming the leaf; an unknown or missing key of the
        mapping, or an unknown merge.
    """
    if not isinstance(value, dict):
        return check_layers(value)
    unknown = sorted(set(value) - {"leaves", "merge", "layers"})
    if unknown:
        raise ConfigError(f"config key 'network': unknown key {unknown[0]!r}; a network of "
                          f"several inputs has leaves, merge and layers")
    leaves = value.get("leaves")
    if not isinstance(leaves, dict) or not leaves or not all(
            isinstance(name, str) or _index(name) for name in leaves):
        raise ConfigError(f"config key 'network': leaves must map observation keys (of a "
                          f"Dict, or indices from 0 of a Tuple) to layer lists, got "
                          f"{leaves!r}")
    merge = value.get("merge", "concatenate")
    if merge not in MERGES:
        raise ConfigError(f"config key 'network': merge is {merge!r}; choices: "
                          f"{', '.join(MERGES)}")
    layers = value.get("layers", [])
    checked = {name: check_layers(list_, f"config key 'network', leaf {name!r}")
               for name, list_ in leaves.items()}
    for name, list_ in checked.items():
        if any(layer["type"] in RECURRENT for layer in list_):
            raise ConfigError(f"config key 'network', leaf {name!r}: a recurrent layer goes "
                              f"last in the layers after the merge, not in a leaf")
    return {"leaves": checked,
            "merge": merge,
            "layers": check_layers(layers, "config key 'network', layers") if layers else []}


def _index(name):
    return isinstance(name, int) and not isinstance(name, bool) and name >= 0


def check_layers(value, where="config key 'network'"):
    """A layer list with every layer's defaults filled in.

    Args:
      value: a list of mappings, each with `type` (a key of `LAYERS`) and that type's keys.
      where: what the messages name it.

    Returns:
      list of dicts, each with `type` and all of its type's keys.

    Raises:
      ConfigError: not a non-empty list of mappings; an unknown type or key; a missing
        required key; a value of the wrong type or range. The message names the layer by
        its position (from 1) and type.
    """
    checked = _check_list(value, where, LAYERS, "layer")
    recurrent = [index for index, layer in enumerate(checked, 1)
                 if layer["type"] in RECURRENT]
    if recurrent and recurrent != [len(checked)]:
        raise ConfigError(f"{where}, layer {recurrent[0]} ({checked[recurrent[0] - 1]['type']}):"
                          f" a recurrent layer must be the last of the list, and the only one")
    return checked


def check_preprocessing(value, where="config key 'preprocessing'"):
    """The preprocessing list of config key `key` with defaults filled in (an empty list:
    none), or for a `Dict` observation a mapping of its keys to such lists. Raises
    `ConfigError` as `check_layers` does."""
    if isinstance(value, dict):
        return {name: check_preprocessing(steps, f"{where}, leaf {name!r}")
                for name, steps in value.items()}
    if value == []:
        return []
    checked = _check_list(value, where, PREPROCESSING, "step")
    for index, step in enumerate(checked[1:], 2):
        if step["type"] == "frame_stack":
            raise ConfigError(f"{where}, step {index} (frame_stack): frame_stack stacks the "
                              f"raw observations; make it the first step")
    first = 1 if checked[0]["type"] == "frame_stack" else 0
    for index, step in enumerate(checked[first + 1:], first + 2):
        if step["type"] == "normalize":
            raise ConfigError(f"{where}, step {index} (normalize): the normalization takes "
                              f"the raw observations; make it the first step (after "
                              f"frame_stack)")
    if checked[0]["type"] == "frame_stack" and checked[0]["frames"] < 2:
        raise ConfigError(f"{where}, step 1 (frame_stack): key 'frames' must be at least 2, "
                          f"got {checked[0]['frames']}")
    return checked


Plan = collections.namedtuple("Plan", "frames, normalized, network")


def plan(preprocessing):
    """Where the steps of a checked `preprocessing` (`check_preprocessing`) run: the one
    reader of the list, which `batchrl.build`, the networks, the Agent and export ask.

    Each step runs on the one floor where it can keep what it must keep:
    - `frames`: the `frames` of the `frame_stack` step (for a mapping of `Dict` entries to
      lists, a dict of the entries with one to their `frames`), or None. The batch of
      environments stacks them (`batchrl.environments.frame_stack.FrameStack`) before the
      algorithm sees an observation, so that a replay memory keeps each frame once
      (`replay_frame_stack`) and a policy acts on the stack without a recurrent state.
    - `normalized`: None (no `normalize` step), True (one: the whole observation), or the
      set of `Dict` keys whose lists have one. The acting half's observation filter
      normalizes them (running statistics, kept in checkpoints and exported with the
      policy; the algorithm turns its `normalize_observ` on for them).
    - `network`: the other steps (`scale`, `grayscale`, `resize`, `crop`,
      `channels_last`), in order: a list, or a dict of lists for `Dict` entries. The
      network runs them on what it is given, so that memories keep uint8 frames as bytes
      and an exported model takes the environment's raw frames.

    Returns:
      `Plan(frames, normalized, network)`.
    """
    if isinstance(preprocessing, dict):
        parts = {str(key): plan(steps) for key, steps in preprocessing.items()}
        frames = {key: part.frames for key, part in parts.items() if part.frames}
        normalized = {key for key, part in parts.items() if part.normalized}
        return Plan(frames or None, normalized or None,
                    {key: part.network for key, part in parts.items()})
    steps = list(preprocessing or [])
    frames = steps[0]["frames"] if steps and steps[0]["type"] == "frame_stack" else None
    normalized = True if any(step["type"] == "normalize" for step in steps) else None
    network = [step for step in steps if step["type"] not in ("frame_stack", "normalize")]
    return Plan(frames, normalized, network)


def _check_list(value, where, types, noun):
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of {noun}s (mappings with a "
                          f"type), got {value!r}")
    return [_check_item(item, f"{where}, {noun} {index}", types)
            for index, item in enumerate(value, 1)]


def _check_item(item, where, types):
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise ConfigError(f"{where}: expected a mapping with a type (one of "
                          f"{', '.join(types)}), got {item!r}")
    kind = item["type"]
    if kind not in types:
        raise ConfigError(f"{where}: unknown type {kind!r}; types: {', '.join(types)}")
    where = f"{where} ({kind})"
    keys = types[kind]
    unknown = sorted(set(item) - set(keys) - {"type"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; keys of {kind}: "
                          f"{', '.join(keys) or 'none'}")
    checked = {"type": kind}
    for name, default in keys.items():
        # A default that a later step decides ("config", "space") may come back as it is:
        # checking a checked list gives the same list.
        if name not in item or (default in ("config", "space") and item[name] == default):
            if default is None and name not in _OPTIONAL_NONE.get(kind, ()):
                raise ConfigError(f"{where}: missing key {name!r}")
            checked[name] = (default if default in (None, "config", "space")
                             else _check_field(name, default, where))
            continue
        checked[name] = _check_field(name, item[name], where)
    return checked


def _check_field(name, value, where):
    """Checks one key's value by the key's name; returns it."""
    if name in ("activation", "function"):
        return _choice(name, value, ACTIVATIONS, where)
    if name == "initializer":
        return _choice(name, value, INITIALIZERS, where)
    if name == "padding":
        return _choice(name, value, PADDINGS, where)
    if name == "factor":
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{where}: key 'factor' must be a positive number, got {value!r}")
        return float(value)
    if name in ("kernel", "size", "stride"):
        pair = value if isinstance(value, list) else [value, value]
        if len(pair) != 2 or not all(_positive_int(x) for x in pair):
            raise ConfigError(f"{where}: key {name!r} must be a positive integer or a list of "
                              f"two, got {value!r}")
        return pair
    minimum = 0 if name in ("top", "left") else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: key {name!r} must be an integer >= {minimum}, got "
                          f"{value!r}")
    return value


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _choice(name, value, choices, where):
    if value not in choices:
        raise ConfigError(f"{where}: key {name!r} is {value!r}; choices: {', '.join(choices)}")
    return value

"""Nested Gymnasium spaces (`Dict`, `Tuple`) as the flat float32 vectors that batches,
memories and networks work on. Free of TensorFlow: worker processes import it.

Observations are flattened as `gymnasium.spaces.flatten` flattens them: the leaves in the
space's order (a `Dict`'s keys in its order, which Gymnasium sorts; a `Tuple`'s positions),
a `Box` leaf's elements as they are, a `Discrete` leaf one-hot, a `MultiDiscrete` leaf one-hot
per element, a `MultiBinary` leaf's bits. Actions are flattened compactly, one number per
choice: a `Box` leaf's elements (in [-1, 1] where all its bounds are finite, mapped linearly
onto them), a `Discrete` leaf's index (`value - start`), a `MultiDiscrete` leaf's indices, a
`MultiBinary` leaf's bits.

A leaf is named in error messages by its path, as it is indexed: `observation['angle']`,
`action[1]['kind']`.
"""

import collections
import collections.abc

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["FlatActionSpace", "FlatObservation", "FlatObservationSpace", "UnflattenAction",
           "check_batch", "check_observation", "leaf_key", "leaf_name", "leaves",
           "normalized_elements"]

LEAF_TYPES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# The `Dict` entry of an observation that says which actions may be taken (1) and which not.
ACTION_MASK = "action_mask"

Leaf = collections.namedtuple("Leaf", "path, space, offset, size")
Leaf.__doc__ = """One leaf of a nested space and where it lies in the flat vector.

`path`: tuple of `Dict` keys and `Tuple` positions from the root; `space`: the leaf's space;
`offset`, `size`: its elements are `flat[offset:offset + size]`.
"""


def leaves(space):
    """The `(path, leaf space)` pairs of `space` in flattening order; `[((), space)]` for a
    space that is not a `Dict` or a `Tuple`."""
    if isinstance(space, spaces.Dict):
        return [((key,) + path, leaf) for key, sub in space.spaces.items()
                for path, leaf in leaves(sub)]
    if isinstance(space, spaces.Tuple):
        return [((index,) + path, leaf) for index, sub in enumerate(space.spaces)
                for path, leaf in leaves(sub)]
    return [((), space)]


def leaf_name(prefix, path):
    """How the leaf at `path` is indexed: `leaf_name("observation", ("a", 0))` is
    `observation['a'][0]`."""
    return prefix + "".join(f"[{key!r}]" for key in path)


def leaf_key(prefix, path):
    """The leaf's name in a SavedModel signature: `prefix` and the path joined by `_`
    (`observation_angle`, `action_1_kind`); `prefix` itself for the root."""
    return "_".join([prefix, *(str(key) for key in path)])


def check_space(space, what):
    """Checks that `space` is a supported leaf, or a `Dict` / `Tuple` of such (nested).

    Args:
      space: a `gymnasium.spaces.Space`.
      what: "observation" or "action", for the message.

    Raises:
      ValueError: naming the first unsupported leaf, or an empty `Dict` / `Tuple`.
    """
    _check_space(space, what, space, ())


def _check_space(space, what, root, path):
    if isinstance(space, spaces.Dict | spaces.Tuple):
        subs = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        subs = list(subs)
        if not subs:
            where = f": {leaf_name(what, path)} is" if path else " is"
            raise ValueError(f"unsupported {what} space {root}{where} an empty "
                             f"{type(space).__name__}")
        for key, sub in subs:
            _check_space(sub, what, root, path + (key,))
    elif not isinstance(space, LEAF_TYPES):
        where = f": {leaf_name(what, path)} is {space}" if path else ""
        raise ValueError(
            f"unsupported {what} space {root}{where}; supported: Box, Discrete, "
            f"MultiDiscrete, MultiBinary, and Dict / Tuple of these")


class FlatObservationSpace(spaces.Box):
    """The float32 `Box` of a nested observation space's flattened observations
    (`gymnasium.spaces.flatten_space`, bounds cast to float32).

    Attributes:
      space: the nested space.
      normalize: bool `[size]`, the elements that come from `Box` leaves (to be normalized);
        one-hot and binary elements, and those of an action mask, are False.
      byte_valued: bool `[size]`, the elements whose values are always integers in [0, 255]:
        those of uint8 and bool `Box` leaves (images, binary frames), one-hot `Discrete` and
        `MultiDiscrete` elements and `MultiBinary` bits. Memories keep them as uint8 where
        they are not normalized (`batchrl.memories.observation_storage`).
      action_mask: `(offset, size)` of the elements of the `Dict` entry `"action_mask"` (a
        `MultiBinary(n)` or a `Box` of n elements in [0, 1]: 1 where an action may be
        taken), or None when there is none; the policy masks its logits with it.

    Equal to another `FlatObservationSpace` of an equal nested space only.

    Raises:
      ValueError: the space has an unsupported leaf (see `check_space`).
    """

    def __init__(self, space):
        check_space(space, "observation")
        flat = spaces.flatten_space(space)
        super().__init__(np.asarray(flat.low, np.float32), np.asarray(flat.high, np.float32),
                         dtype=np.float32)
        self.space = space
        self.normalize = np.concatenate([
            np.full(spaces.flatdim(leaf), isinstance(leaf, spaces.Box)
                    and path != (ACTION_MASK,))
            for path, leaf in leaves(space)])
        self.byte_valued = np.concatenate([
            np.full(spaces.flatdim(leaf), _byte_valued(leaf)) for _, leaf in leaves(space)])
        self.action_mask = None
        offset = 0
        for path, leaf in leaves(space):
            if path == (ACTION_MASK,):
                self.action_mask = (offset, spaces.flatdim(leaf))
            offset += spaces.flatdim(leaf)

    def __eq__(self, other):
        return (isinstance(other, FlatObservationSpace) and super().__eq__(other)
                and self.space == other.space)

    def __repr__(self):
        return f"FlatObservationSpace({self.space})"


def _byte_valued(leaf):
    """Whether every element of the leaf's flattened values is an integer in [0, 255]."""
    if isinstance(leaf, spaces.Box):
        return np.dtype(leaf.dtype) in (np.uint8, np.bool_)
    return True  # One-hot indices and bits.


def normalized_elements(space, keys=None):
    """bool array of the observation shape, the elements an observation normalizer should
    center and scale, for a `FlatObservationSpace`; None (all of them) for any other space.
    With `keys` (top-level keys of a `Dict` observation, or indices of a `Tuple`), only the
    elements of those entries among them."""
    if not isinstance(space, FlatObservationSpace):
        return None
    if keys is None:
        return space.normalize
    keys = {str(key) for key in keys}  # A Tuple's indices may come as text.
    listed = np.concatenate([np.full(spaces.flatdim(leaf), str(path[0]) in keys)
                             for path, leaf in leaves(space.space)])
    return space.normalize & listed


def _rescaled(leaf):
    """Whether the agent acts in [-1, 1] for the `Box` leaf (all its bounds finite)."""
    return bool(np.isfinite(leaf.low).all() and np.isfinite(leaf.high).all())


class FlatActionSpace(spaces.Box):
    """The float32 `Box` of a nested action space's flat actions, one number per choice (see
    the module docstring), for `Box`, `Discrete`, `MultiDiscrete` and `MultiBinary` leaves
    and `Dict` / `Tuple` of these.

    Bounds: [-1, 1] for the elements of a `Box` leaf with finite bounds, the leaf's own
    bounds for one with an infinite bound, [0, n - 1] for an index, [0, 1] for a bit.

    Attributes:
      space: the nested space.
      leaves: tuple of `Leaf`, in flattening order.

    Raises:
      ValueError: the space has an unsupported leaf (see `check_space`).
    """

    def __init__(self, space):
        check_space(space, "action")
        result, low, high, offset = [], [], [], 0
        for path, leaf in leaves(space):
            if isinstance(leaf, spaces.Box):
                bounds = (-1.0, 1.0) if _rescaled(leaf) else (leaf.low, leaf.high)
                leaf_low, leaf_high = (np.broadcast_to(bound, leaf.shape).reshape(-1)
                                       for bound in bounds)
            elif isinstance(leaf, spaces.Discrete):
                leaf_low, leaf_high = np.zeros(1), np.array([leaf.n - 1])
            elif isinstance(leaf, spaces.MultiDiscrete):
                leaf_low, leaf_high = np.zeros(leaf.nvec.size), leaf.nvec.reshape(-1) - 1
            else:
                size = int(np.prod(leaf.shape))
                leaf_low, leaf_high = np.zeros(size), np.ones(size)
            result.append(Leaf(path, leaf, offset, len(leaf_low)))
            low.append(leaf_low)
            high.append(leaf_high)
            offset += len(leaf_low)
        super().__init__(np.concatenate(low).astype(np.float32),
                         np.concatenate(high).astype(np.float32), dtype=np.float32)
        self.space = space
        self.leaves = tuple(result)

    def __eq__(self, other):
        return (isinstance(other, FlatActionSpace) and super().__eq__(other)
                and self.space == other.space)

    def __repr__(self):
        return f"FlatActionSpace({self.space})"

    def unflatten(self, action):
        """The nested action of the flat `action` (float `[size]`): a `Box` leaf clipped to
        [-1, 1] and mapped onto its bounds (where finite; as `RescaleAction` and `ClipAction`
        do for a plain `Box`), in its dtype; indices plus the leaf's `start`, int64; bits,
        int8. A `Dict` becomes a dict, a `Tuple` a tuple.

        Raises:
          ValueError: `action` has the wrong shape, or an index or a bit is not one of the
            leaf's (naming the leaf).
        """
        action = np.asarray(action, np.float64)
        if action.shape != self.shape:
            raise ValueError(f"flat action of shape {action.shape}, expected {self.shape}")
        values = {}
        for leaf in self.leaves:
            part = action[leaf.offset:leaf.offset + leaf.size]
            space = leaf.space
            if isinstance(space, spaces.Box):
                if _rescaled(space):
                    low, high = space.low.reshape(-1), space.high.reshape(-1)
                    part = low + (np.clip(part, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
                    part = np.clip(part, low, high)
                values[leaf.path] = part.reshape(space.shape).astype(space.dtype)
                continue
            index = np.rint(part)
            bounds = slice(leaf.offset, leaf.offset + leaf.size)
            if (index != part).any() or (index < self.low[bounds]).any() \
                    or (index > self.high[bounds]).any():
                raise ValueError(f"{leaf_name('action', leaf.path)}: {part.tolist()} is not a "
                                 f"valid flat action of {space}")
            index = index.astype(np.int64)
            if isinstance(space, spaces.Discrete):
                values[leaf.path] = np.int64(space.start + index[0])
            elif isinstance(space, spaces.MultiDiscrete):
                values[leaf.path] = (space.start + index.reshape(space.shape)).astype(
                    space.dtype)
            else:
                values[leaf.path] = index.reshape(space.shape).astype(space.dtype)
        return _assemble(self.space, values, ())


def _assemble(space, values, path):
    """The nested structure of `space` holding `values[path]` at each leaf."""
    if isinstance(space, spaces.Dict):
        return {key: _assemble(sub, values, path + (key,)) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_assemble(sub, values, path + (index,))
                     for index, sub in enumerate(space.spaces))
    return values[path]


def check_observation(space, observation, name="observation"):
    """Checks one observation of a nested space, leaf by leaf.

    Args:
      space: the (nested) observation space.
      observation: a value of it: a mapping for a `Dict`, a sequence for a `Tuple`.
      name: how the root is called in messages.

    Returns:
      The observation with numpy arrays at the leaves (float32 for `Box`, int64 for
      `Discrete` and `MultiDiscrete`, int8 for `MultiBinary`).

    Raises:
      ValueError: naming the leaf: a missing or unexpected key, a `Tuple` of the wrong
        length, a leaf of the wrong shape, a non-finite `Box` element, an integer outside
        its `Discrete` / `MultiDiscrete` range, a bit that is not 0 or 1.
    """
    return _check(space, observation, name, ())


def check_batch(space, observation, batch, name="observation"):
    """`check_observation` for a batch: every leaf has the leading dimension `batch`, and
    messages name the batch indices of bad values ("for environments [0, 2]")."""
    return _check(space, observation, name, (batch,))


def _check(space, value, name, batch):
    if isinstance(space, spaces.Dict):
        if not isinstance(value, collections.abc.Mapping):
            raise ValueError(f"{name} must be a mapping of {list(space.spaces)}, got "
                             f"{type(value).__name__}")
        missing = [key for key in space.spaces if key not in value]
        if missing:
            raise ValueError(f"{leaf_name(name, (missing[0],))} is missing; expected keys "
                             f"{list(space.spaces)}")
        extra = [key for key in value if key not in space.spaces]
        if extra:
            raise ValueError(f"{leaf_name(name, (extra[0],))} is not in the space; expected "
                             f"keys {list(space.spaces)}")
        return {key: _check(sub, value[key], leaf_name(name, (key,)), batch)
                for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, list | tuple) or len(value) != len(space.spaces):
            raise ValueError(f"{name} must be a tuple of {len(space.spaces)} values, got "
                             f"{_describe(value)}")
        return tuple(_check(sub, item, leaf_name(name, (index,)), batch)
                     for index, (sub, item) in enumerate(zip(space.spaces, value, strict=True)))
    return _check_leaf(space, value, name, batch)


def _describe(value):
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def _check_leaf(space, value, name, batch):
    array = np.asarray(value)
    shape = tuple(space.shape)
    if array.shape != batch + shape:
        raise ValueError(f"{name} of shape {array.shape}, expected {batch + shape}")
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold numbers, got dtype {array.dtype}")
    if isinstance(space, spaces.Box):
        array = array.astype(np.float32)
        bad = ~np.isfinite(array)
        if bad.any():
            raise ValueError(f"{name} is not finite{_where(bad, batch, array)}")
        return array
    if isinstance(space, spaces.MultiBinary):
        bad = (array != 0) & (array != 1)
        if bad.any():
            raise ValueError(f"{name} holds values other than 0 and 1{_where(bad, batch, array)}")
        return array.astype(np.int8)
    if isinstance(space, spaces.Discrete):
        low, high = space.start, space.start + space.n
    else:
        low, high = space.start, space.start + space.nvec
    bad = (array != np.rint(array)) | (array < low) | (array >= high)
    if np.any(bad):
        raise ValueError(f"{name} holds values outside {space}{_where(bad, batch, array)}")
    return array.astype(np.int64)


def _where(bad, batch, array):
    """Which batch entries hold bad values, or the bad value of a single observation."""
    if batch:
        rows = np.flatnonzero(np.asarray(bad).reshape(batch[0], -1).any(1))
        return f" for environments {rows.tolist()}"
    return f": {array.tolist()}"


class FlatObservation(gymnasium.wrappers.FlattenObservation):
    """Gymnasium's `FlattenObservation` for nested observation spaces, checked leaf by leaf
    and cast to float32: declares a `FlatObservationSpace` and returns float32
    `[space.shape[0]]` observations.

    Raises:
      ValueError: at construction, for an unsupported observation space; from `step` and
        `reset`, for an observation of the wrong structure, shape or range, or with a
        non-finite `Box` element, naming the leaf (`check_observation`).
    """

    def __init__(self, env):
        flat = FlatObservationSpace(env.observation_space)
        super().__init__(env)
        self.observation_space = flat

    def observation(self, observation):
        check_observation(self.env.observation_space, observation)
        return super().observation(observation).astype(np.float32)


class UnflattenAction(gymnasium.ActionWrapper):
    """Lets an agent act in an environment with a nested action space through flat actions:
    declares a `FlatActionSpace` and passes `action_space.unflatten(action)` on.

    Raises:
      ValueError: at construction, for an unsupported action space; from `step`, for an
        action that `FlatActionSpace.unflatten` refuses.
    """

    def __init__(self, env):
        flat = FlatActionSpace(env.action_space)
        super().__init__(env)
        self.action_space = flat

    def action(self, action):
        return self.action_space.unflatten(action)

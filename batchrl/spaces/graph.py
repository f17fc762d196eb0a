"""The spaces a policy works in, and the maps between them and an environment's spaces inside
the graph (shared by `batchrl.Agent` and the exported SavedModel).

A policy sees a `Box` observation as it is (cast to float32) and any other observation
space flattened (`batchrl.spaces.nested.FlatObservationSpace`: `Discrete` leaves one-hot,
exactly as `gymnasium.spaces.flatten`). It acts in [-1, 1] for a `Box` with finite bounds,
with indices from 0 for `Discrete` (`value - start`), and with one flat float32 vector for
any other action space (`batchrl.spaces.nested.FlatActionSpace`). These functions are the
graph versions of what `batchrl.environments.wrappers.standard_wrappers` does to the
environments of `train`.
"""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl.spaces import nested


def observation_dtype(observation_space):
    """The dtype in which a batch holds observations of the `Box` `observation_space`:
    uint8 for a uint8 or bool `Box` (images and binary frames stay a byte an element, in the
    batch and in the memories; the networks convert them), float32 for any other."""
    if np.dtype(observation_space.dtype) in (np.uint8, np.bool_):
        return tf.uint8
    return tf.float32


def policy_observation_space(space):
    """The observation space the policy sees: `space` itself for a `Box`, else its
    `FlatObservationSpace`.

    Raises:
      ValueError: the space has an unsupported leaf (naming it).
    """
    return space if isinstance(space, gym.spaces.Box) else nested.FlatObservationSpace(space)


def policy_action_space(space):
    """The action space the policy acts in (as `batchrl.environments.wrappers.standard_wrappers`
    gives `train`): `Box(-1, 1)` for a `Box` with finite bounds, `space` itself for any other
    `Box`, `Discrete(n)` for `Discrete(n, start)` (indices from 0), else its
    `FlatActionSpace`.

    Raises:
      ValueError: the space has an unsupported leaf (naming it).
    """
    if isinstance(space, gym.spaces.Box):
        if np.isfinite(space.low).all() and np.isfinite(space.high).all():
            return gym.spaces.Box(-1.0, 1.0, space.shape, np.float32)
        return space
    if isinstance(space, gym.spaces.Discrete):
        return space if space.start == 0 else gym.spaces.Discrete(space.n)
    return nested.FlatActionSpace(space)


def _leaf_dtype(leaf):
    """The dtype of a leaf's values in the graph: float32 for a `Box`, int64 for `Discrete`
    and `MultiDiscrete` (Gymnasium's), int8 for `MultiBinary`."""
    if isinstance(leaf, gym.spaces.Box):
        return tf.float32
    return tf.int8 if isinstance(leaf, gym.spaces.MultiBinary) else tf.int64


def _structure(space, leaf_function, path=()):
    """`space`'s nesting (dicts for `Dict`, tuples for `Tuple`) of `leaf_function(path,
    leaf)` at the leaves."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _structure(sub, leaf_function, path + (key,))
                for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_structure(sub, leaf_function, path + (index,))
                     for index, sub in enumerate(space.spaces))
    return leaf_function(path, space)


def _at(value, path):
    for key in path:
        value = value[key]
    return value


def observation_spec(space, batch=None):
    """The `tf.TensorSpec`s of a batch of observations of `space`, nested like it: float32
    `[batch, *shape]` for a `Box` (uint8 for a uint8 or bool `Box` observation, images and
    binary frames, as `observation_dtype`) and a `Box` leaf, int64 `[batch]` for
    `Discrete`, int64 `[batch, *shape]` for `MultiDiscrete`, int8 `[batch, *shape]` for
    `MultiBinary`. Named
    `observation` for a single space, `observation_KEY...` per leaf of a nested one
    (`nested.leaf_key`), which are the input names of a SavedModel signature."""
    if isinstance(space, gym.spaces.Box):
        return tf.TensorSpec((batch,) + tuple(space.shape), observation_dtype(space),
                             name="observation")
    return _structure(space, lambda path, leaf: tf.TensorSpec(
        (batch,) + tuple(leaf.shape), _leaf_dtype(leaf),
        name=nested.leaf_key("observation", path)))


def to_policy_observation(observation, space):
    """Maps a batch of observations of `space` (nested like `observation_spec`) onto what
    the policy sees, inside the graph: `[n, *shape]` of `observation_dtype` for a `Box`
    (float32, or uint8 for images and binary frames); for any other space
    float32 `[n, size]`, the leaves flattened and concatenated as `gymnasium.spaces.flatten`
    does (a `Box` leaf's elements, one-hot `Discrete` and `MultiDiscrete` values, bits)."""
    if isinstance(space, gym.spaces.Box):
        return tf.cast(observation, observation_dtype(space))
    parts = []
    for path, leaf in nested.leaves(space):
        value = _at(observation, path)
        if isinstance(leaf, gym.spaces.Discrete):
            parts.append(tf.one_hot(tf.cast(value, tf.int64) - leaf.start, leaf.n))
        elif isinstance(leaf, gym.spaces.MultiDiscrete):
            nvec = leaf.nvec.reshape(-1)
            offset = np.concatenate([[0], np.cumsum(nvec)[:-1]]) - leaf.start.reshape(-1)
            index = tf.reshape(tf.cast(value, tf.int64), [-1, nvec.size]) + offset
            parts.append(tf.reduce_sum(tf.one_hot(index, int(nvec.sum())), -2))
        else:
            value = tf.cast(value, tf.float32)
            parts.append(tf.reshape(value, [-1, int(np.prod(leaf.shape))]))
    return tf.concat(parts, -1)


def _box(action, space):
    """A `Box` action `[n, ...]` of the policy (its elements in the order of `space`) in
    `space`: clipped to [-1, 1] and mapped linearly onto finite bounds; float32
    `[n, *shape]`."""
    action = tf.reshape(action, [-1, int(np.prod(space.shape))])
    if np.isfinite(space.low).all() and np.isfinite(space.high).all():
        low = tf.constant(space.low.reshape(-1), tf.float32)
        high = tf.constant(space.high.reshape(-1), tf.float32)
        action = low + (tf.clip_by_value(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
    return tf.reshape(action, (-1,) + tuple(space.shape))


def to_action_space(action, space):
    """Maps a batch of policy actions into `space`, inside the graph.

    For a `Box` with finite bounds, `action` (float32 `[n, *shape]`, in [-1, 1] by design)
    is clipped to [-1, 1] and mapped linearly onto [low, high]; an unbounded `Box`'s
    actions pass as they are; a `Discrete` space's indices (int32 `[n]`, from 0) become
    `start + index`. For a nested space, `action` (float32
    `[n, size]` of its `FlatActionSpace`) becomes the space's nesting of: float32
    `[n, *shape]` for a `Box` leaf (mapped as above), int32 `[n]` for `Discrete` and
    `[n, *shape]` for `MultiDiscrete` (indices plus `start`), int8 `[n, *shape]` for
    `MultiBinary` — as `FlatActionSpace.unflatten` maps one flat action.
    """
    if isinstance(space, gym.spaces.Discrete):  # Start 0: no op, exported graphs as before.
        return action + int(space.start) if space.start else action
    policy_space = policy_action_space(space)
    if not isinstance(policy_space, nested.FlatActionSpace):
        if policy_space is space:
            return action
        return _box(action, space)
    pieces = {}
    for leaf in policy_space.leaves:
        piece = action[:, leaf.offset:leaf.offset + leaf.size]
        sub = leaf.space
        if isinstance(sub, gym.spaces.Box):
            pieces[leaf.path] = _box(piece, sub)
            continue
        index = tf.cast(tf.round(piece), tf.int32)
        if isinstance(sub, gym.spaces.Discrete):
            pieces[leaf.path] = index[:, 0] + int(sub.start)
        elif isinstance(sub, gym.spaces.MultiDiscrete):
            start = tf.constant(sub.start, tf.int32)
            pieces[leaf.path] = tf.reshape(index, (-1,) + tuple(sub.shape)) + start
        else:
            pieces[leaf.path] = tf.cast(tf.reshape(index, (-1,) + tuple(sub.shape)), tf.int8)
    return _structure(space, lambda path, leaf: pieces[path])


def from_action_space(action, space):
    """The inverse of `to_action_space` for a batch of actions of `space` (NumPy): what the
    policy would have output to take them, for transitions from outside (`Agent.update`).

    A `Box` with finite bounds maps [low, high] linearly onto [-1, 1] (float32 `[n,
    *shape]`); another `Box` passes as float32; `Discrete` gives int32 `[n]` indices from 0.

    Raises:
      ValueError: a nested action space (not supported here), an action outside a bounded
        `Box` or a `Discrete` range, or a wrong shape.
    """
    if isinstance(space, gym.spaces.Discrete):
        index = np.asarray(action).astype(np.int64) - int(space.start)
        if index.ndim != 1 or ((index < 0) | (index >= space.n)).any():
            raise ValueError(f"actions of {space} must be integers [n] in its range")
        return index.astype(np.int32)
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"transitions of nested action spaces ({space}) cannot be added yet")
    action = np.asarray(action, np.float32)
    if action.shape[1:] != space.shape:
        raise ValueError(f"actions of shape {action.shape}, expected [n, *{space.shape}]")
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        return action
    if ((action < space.low) | (action > space.high)).any():
        raise ValueError(f"actions outside the bounds of {space}")
    return (2.0 * (action - space.low) / (space.high - space.low) - 1.0).astype(np.float32)


def named_actions(action, space):
    """The actions of `to_action_space` as a flat dict for a SavedModel signature: `action`
    for a single space, `action_KEY...` per leaf of a nested one (`nested.leaf_key`)."""
    if isinstance(policy_action_space(space), nested.FlatActionSpace):
        return {nested.leaf_key("action", path): _at(action, path)
                for path, _ in nested.leaves(space)}
    return {"action": action}

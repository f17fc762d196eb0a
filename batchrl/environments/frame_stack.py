"""Frame stacking inside the graph: each agent's last observations, joined on the last axis
(the preprocessing step `frame_stack`, `batchrl.networks.spec`), of a whole `Box`
observation or of entries of a `Dict` / `Tuple` one."""

import collections
import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl.environments.in_graph import WrappingView
from batchrl.spaces import nested

# Where a part of the observation lies in the flat observation (`offset`, `size`) and in the
# flat stacked one (`stacked_offset`), its channels (last axis) and the frames kept of it
# (1: not stacked).
_Part = collections.namedtuple("_Part", "offset, size, stacked_offset, channels, frames")


def _stacked_box(space, frames, what):
    if not isinstance(space, gym.spaces.Box) or not space.shape:
        raise ValueError(f"frame_stack needs a Box {what} with at least one axis, got {space}")
    return gym.spaces.Box(np.concatenate([space.low] * frames, -1),
                          np.concatenate([space.high] * frames, -1), dtype=space.dtype)


def stacked_space(observation_space, frames):
    """The space of stacked observations: for an int `frames`, the `Box` of `frames`
    observations of the `Box` `observation_space` joined on its last axis (`[..., c]` ->
    `[..., frames * c]`, the bounds repeated); for a dict `frames` (entry -> frames; a
    `Tuple`'s positions as text), the `Dict` / `Tuple` `observation_space` with those
    entries stacked so.

    Raises:
      ValueError: a space that is not a `Box` (int `frames`) or not a `Dict` / `Tuple`
        (dict `frames`), an entry it lacks, or an entry that is not a `Box` with an axis;
        the message names it.
    """
    if not isinstance(frames, dict):
        return _stacked_box(observation_space, int(frames), "observation")
    if not isinstance(observation_space, gym.spaces.Dict | gym.spaces.Tuple):
        raise ValueError(f"frame_stack per entry needs a Dict or Tuple observation, got "
                         f"{observation_space}")
    entries = (observation_space.spaces.items() if isinstance(observation_space, gym.spaces.Dict)
               else enumerate(observation_space.spaces))
    entries = dict(entries)
    unknown = sorted(set(frames) - {str(key) for key in entries})
    if unknown:
        raise ValueError(f"frame_stack of observation entry {unknown[0]!r}: the observation "
                         f"has the entries {[str(key) for key in entries]}")
    stacked = {key: _stacked_box(space, frames[str(key)], f"observation entry {str(key)!r}")
               if str(key) in frames else space for key, space in entries.items()}
    if isinstance(observation_space, gym.spaces.Dict):
        return gym.spaces.Dict(stacked)
    return gym.spaces.Tuple(tuple(stacked.values()))


def _parts(observation_space, frames):
    """The `_Part`s of the flat observation, and the stacked observation space."""
    if not isinstance(frames, dict):
        space = stacked_space(observation_space, frames)
        size = math.prod(observation_space.shape)
        return [_Part(0, size, 0, observation_space.shape[-1], int(frames))], space
    if not isinstance(observation_space, nested.FlatObservationSpace):
        raise ValueError(f"frame_stack per entry needs a Dict or Tuple observation, got "
                         f"{observation_space}")
    stacked = nested.FlatObservationSpace(stacked_space(observation_space.space, frames))
    parts, offset, stacked_offset = [], 0, 0
    for path, leaf in nested.leaves(observation_space.space):
        size = gym.spaces.flatdim(leaf)
        count = int(frames.get(str(path[0]), 1))
        parts.append(_Part(offset, size, stacked_offset,
                           leaf.shape[-1] if count > 1 else None, count))
        offset, stacked_offset = offset + size, stacked_offset + count * size
    return parts, stacked


class FrameStack(WrappingView):
    """An in-graph batch of environments whose observations are each agent's last `frames`
    observations of `batch_env` (or of some entries of a nested observation), joined on
    the last axis, the oldest first.

    `observ` is `[B, ..., frames * c]` of the dtype of `batch_env.observ` (uint8 frames
    stay uint8); for a nested observation (flat float32 `[B, n]`), the flat observation of
    `observation_space`, the stacked space (`stacked_space`), each stacked entry `[...,
    frames * c]` in its place. `action`, `reward`, `done` and `terminated` are
    `batch_env`'s. `reset` fills an agent's stack with the new episode's first observation
    (as EnvPool and Gymnasium's `FrameStackObservation(padding_type="reset")` do);
    `simulate` drops the oldest observation and appends the new one, also the final
    observation of an episode that ended, so that it is stacked with its own episode's
    observations. Other attributes reach `batch_env`.

    Args:
      batch_env: an in-graph batch (`InGraphBatchEnv`, or an environment of
        `batchrl.native_tasks`).
      frames: int >= 2, the observations a stack holds; or, for a `Dict` / `Tuple`
        observation, a dict of its entries (keys; a `Tuple`'s positions as text) to such
        ints, the `Box` entries to stack.

    Raises:
      ValueError: `frames` below 2, or an observation space that `stacked_space` refuses.
    """

    in_graph = True

    def __init__(self, batch_env, frames):
        counts = frames.values() if isinstance(frames, dict) else [frames]
        if not counts or min(int(count) for count in counts) < 2:
            raise ValueError(f"frame_stack needs at least 2 frames, got {frames}")
        self._batch_env = batch_env
        self._parts, self.observation_space = _parts(batch_env.observation_space, frames)
        inner = batch_env.observ
        self._shape = tuple(self.observation_space.shape)
        with tf.name_scope("frame_stack"):
            observ = tf.Variable(tf.zeros((inner.shape[0],) + self._shape, inner.dtype),
                                 trainable=False, name="observ")
        self._observ, self._action = observ, batch_env.action
        self._reward, self._done = batch_env.reward, batch_env.done
        self._terminated = batch_env.terminated

    def _stack(self, new, old=None):
        """The stacked observations `[n, *stacked shape]` after `new` `[n, *shape]`: on the
        stacks `old` `[n, *stacked shape]` (their oldest frames dropped), or, with None,
        `new` repeated."""
        count = tf.shape(new)[0]
        new = tf.reshape(new, [count, -1])
        old = None if old is None else tf.reshape(old, [count, -1])
        pieces = []
        for part in self._parts:
            piece = new[:, part.offset:part.offset + part.size]
            if part.frames > 1:
                piece = tf.reshape(piece, [count, -1, part.channels])  # [n, pixels, c]
                if old is None:
                    piece = tf.tile(piece, [1, 1, part.frames])
                else:
                    end = part.stacked_offset + part.frames * part.size
                    stack = tf.reshape(old[:, part.stacked_offset:end],
                                       [count, -1, part.frames * part.channels])
                    piece = tf.concat([stack[..., part.channels:], piece], -1)
                piece = tf.reshape(piece, [count, -1])
            pieces.append(piece)
        joined = pieces[0] if len(pieces) == 1 else tf.concat(pieces, -1)
        return tf.reshape(joined, tf.concat([[count], self._shape], 0))

    def simulate(self, action):
        """Steps `batch_env` (its `simulate`) and pushes each agent's new observation onto
        its stack; returns bool `[B]`, the new `done`, once the stack is assigned."""
        done = self._batch_env.simulate(action)
        with tf.control_dependencies([done]):
            stacked = self._stack(self._batch_env.observ, self._observ)
            with tf.control_dependencies([self._observ.assign(stacked)]):
                return tf.identity(done)

    def reset(self, indices=None):
        """Resets `batch_env` at `indices` (int32 `[n]`, None for all) and fills their
        stacks with the first observation; returns the stacked observations `[n, *stacked
        shape]` once assigned."""
        if indices is None:
            indices = tf.range(len(self))
        indices = tf.cast(indices, tf.int32)
        stacked = self._stack(self._batch_env.reset(indices))
        with tf.control_dependencies([self._observ.scatter_nd_update(indices[:, None],
                                                                     stacked)]):
            return tf.identity(stacked)

"""Frame stacking inside the graph: each agent's last observations, joined on the last axis
(the preprocessing step `frame_stack`, `batchrl.network_spec`)."""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl.environments.in_graph import WrappingView


def stacked_space(observation_space, frames):
    """The `Box` of `frames` observations of the `Box` `observation_space` joined on its last
    axis: `[..., c]` -> `[..., frames * c]`, the bounds repeated.

    Raises:
      ValueError: for a space that is not a `Box`, or a scalar one.
    """
    if not isinstance(observation_space, gym.spaces.Box) or not observation_space.shape:
        raise ValueError(f"frame_stack needs a Box observation with at least one axis, got "
                         f"{observation_space}")
    return gym.spaces.Box(np.concatenate([observation_space.low] * frames, -1),
                          np.concatenate([observation_space.high] * frames, -1),
                          dtype=observation_space.dtype)


class FrameStack(WrappingView):
    """An in-graph batch of environments whose observations are each agent's last `frames`
    observations of `batch_env`, joined on the last axis, the oldest first.

    `observ` is `[B, ..., frames * c]` of the dtype of `batch_env.observ` (uint8 frames
    stay uint8); `action`, `reward`, `done` and `terminated` are `batch_env`'s. `reset`
    fills an agent's stack with the new episode's first observation (as EnvPool and
    Gymnasium's `FrameStackObservation(padding_type="reset")` do); `simulate` drops the
    oldest observation and appends the new one, also the final observation of an episode
    that ended, so that it is stacked with its own episode's observations. Other
    attributes reach `batch_env`; `observation_space` is the stacked one.

    Args:
      batch_env: an in-graph batch (`InGraphBatchEnv`, or an environment of
        `batchrl.envs`).
      frames: int >= 2, the observations a stack holds.

    Raises:
      ValueError: `frames` below 2, or an observation space that `stacked_space` refuses.
    """

    in_graph = True

    def __init__(self, batch_env, frames):
        if int(frames) < 2:
            raise ValueError(f"frame_stack needs at least 2 frames, got {frames}")
        self._batch_env = batch_env
        self._frames = int(frames)
        self.observation_space = stacked_space(batch_env.observation_space, self._frames)
        inner = batch_env.observ
        with tf.name_scope("frame_stack"):
            observ = tf.Variable(
                tf.zeros(inner.shape[:-1].concatenate([self._frames * inner.shape[-1]]),
                         inner.dtype), trainable=False, name="observ")
        self._observ, self._action = observ, batch_env.action
        self._reward, self._done = batch_env.reward, batch_env.done
        self._terminated = batch_env.terminated

    def simulate(self, action):
        """Steps `batch_env` (its `simulate`) and pushes each agent's new observation onto
        its stack; returns bool `[B]`, the new `done`, once the stack is assigned."""
        done = self._batch_env.simulate(action)
        with tf.control_dependencies([done]):
            size = self._batch_env.observ.shape[-1]
            stacked = tf.concat([self._observ[..., size:], self._batch_env.observ], -1)
            with tf.control_dependencies([self._observ.assign(stacked)]):
                return tf.identity(done)

    def reset(self, indices=None):
        """Resets `batch_env` at `indices` (int32 `[n]`, None for all) and fills their
        stacks with the first observation; returns the stacked observations `[n, ...,
        frames * c]` once assigned."""
        if indices is None:
            indices = tf.range(len(self))
        indices = tf.cast(indices, tf.int32)
        first = self._batch_env.reset(indices)
        stacked = tf.concat([first] * self._frames, -1)
        with tf.control_dependencies([self._observ.scatter_nd_update(indices[:, None],
                                                                     stacked)]):
            return tf.identity(stacked)

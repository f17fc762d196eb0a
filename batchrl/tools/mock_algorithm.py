"""An algorithm that acts at random and learns nothing, for tests and benchmarks."""

import gymnasium as gym
import numpy as np
import tensorflow as tf


class MockAlgorithm:
    """Returns uniformly random valid actions; the other algorithm methods do nothing.

    Box actions are drawn uniformly between the space's bounds (infinite bounds are
    replaced by -1 and 1); Discrete actions uniformly among the `n` choices.

    Args:
      batch_env: an `InGraphBatchEnv`.
      seed: the operation seed of the `tf.random.uniform` draws (int), or None for
        nondeterministic actions. With a seed, a traced function draws the same sequence
        every time it is built.
    """

    def __init__(self, batch_env, seed=None):
        self._space = batch_env.action_space
        self._seed = seed
        if not isinstance(self._space, gym.spaces.Discrete):
            self._low = np.where(np.isfinite(self._space.low), self._space.low,
                                 -1.0).astype(np.float32)
            self._high = np.where(np.isfinite(self._space.high), self._space.high,
                                  1.0).astype(np.float32)

    def begin_episodes(self, agent_indices):
        del agent_indices

    def perform(self, agent_indices, observ):
        """Random actions `[len(agent_indices), *action_shape]`."""
        del observ
        count = agent_indices.shape[0]  # Static when known: fewer ops per step.
        if count is None:
            count = tf.shape(agent_indices)[0]
        # `tf.random.uniform` is one op (plus a scale and a shift) where a
        # `tf.random.Generator` draw is about ten: this runs at every step of `simulate`.
        if isinstance(self._space, gym.spaces.Discrete):
            return tf.random.uniform([count], 0, int(self._space.n), dtype=tf.int32,
                                     seed=self._seed) + int(self._space.start)
        if isinstance(count, int):
            shape = (count, *self._space.shape)
        else:
            shape = tf.concat([[count], self._space.shape], 0)
        return tf.random.uniform(shape, self._low, self._high, dtype=tf.float32,
                                 seed=self._seed)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        del agent_indices, observ, action, reward, done, nextob

    def end_episodes(self, agent_indices):
        del agent_indices

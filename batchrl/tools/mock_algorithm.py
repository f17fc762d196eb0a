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
      seed: seed of the random generator, or None.
    """

    def __init__(self, batch_env, seed=None):
        self._batch_env = batch_env
        self._space = batch_env.action_space
        if seed is None:
            self._random = tf.random.Generator.from_non_deterministic_state()
        else:
            self._random = tf.random.Generator.from_seed(seed)

    def begin_episodes(self, agent_indices):
        del agent_indices

    def perform(self, agent_indices, observ):
        """Random actions `[len(agent_indices), *action_shape]`."""
        del observ
        count = agent_indices.shape[0]  # Static when known: fewer ops per step.
        if count is None:
            count = tf.shape(agent_indices)[0]
        if isinstance(self._space, gym.spaces.Discrete):
            return self._random.uniform(
                [count], 0, int(self._space.n), dtype=tf.int32) + int(self._space.start)
        low = np.where(np.isfinite(self._space.low), self._space.low, -1.0).astype(np.float32)
        high = np.where(np.isfinite(self._space.high), self._space.high, 1.0).astype(np.float32)
        if isinstance(count, int):
            shape = (count, *self._space.shape)
        else:
            shape = tf.concat([[count], self._space.shape], 0)
        return self._random.uniform(shape, low, high, dtype=tf.float32)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        del agent_indices, observ, action, reward, done, nextob

    def end_episodes(self, agent_indices):
        del agent_indices

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment


def _batch(durations, observ_shape=(3,), action_shape=(2,), truncate=False):
    envs = [MockEnvironment(observ_shape, action_shape, d, d, truncate=truncate)
            for d in durations]
    return BatchEnv(envs, blocking=True)


def test_variables_shapes_and_forwarding():
    batch_env = _batch([1, 2, 3], observ_shape=(2, 3))
    env = InGraphBatchEnv(batch_env)
    assert len(env) == 3
    assert env[1] is batch_env[1]
    assert env.observation_space == batch_env.observation_space
    assert env.observ.shape == (3, 2, 3) and env.observ.dtype == tf.float32
    assert env.action.shape == (3, 2) and env.action.dtype == tf.float32
    assert env.reward.shape == (3,) and env.done.shape == (3,)
    assert env.done.numpy().all(), "all agents start done, so the first simulate resets them"


def test_reset_and_simulate_assign_variables():
    env = InGraphBatchEnv(_batch([1, 3]))
    observ = env.reset().numpy()
    assert observ.shape == (2, 3)
    np.testing.assert_array_equal(env.observ.numpy(), observ)
    assert not env.done.numpy().any()
    done = env.simulate(tf.zeros([2, 2])).numpy()
    np.testing.assert_array_equal(done, [True, False])
    np.testing.assert_array_equal(env.terminated.numpy(), [True, False])
    assert env[0].steps == [1] and env[1].steps == [1]
    assert not np.allclose(env.observ.numpy(), observ)
    # Resetting one index touches only that environment.
    new = env.reset(tf.constant([0])).numpy()
    np.testing.assert_array_equal(env.observ.numpy()[0], new[0])
    assert env[0].steps == [1, 0] and env[1].steps == [1]
    np.testing.assert_array_equal(env.done.numpy(), [False, False])
    assert env.reward.numpy()[0] == 0


def test_truncation_sets_done_but_not_terminated():
    env = InGraphBatchEnv(_batch([1], truncate=True))
    env.reset()
    env.simulate(tf.zeros([1, 2]))
    assert env.done.numpy()[0] and not env.terminated.numpy()[0]


def test_discrete_actions_are_int32():
    batch_env = BatchEnv([gym.make("CartPole-v1") for _ in range(2)], blocking=True)
    env = InGraphBatchEnv(batch_env)
    assert env.action.dtype == tf.int32 and env.action.shape == (2,)
    env.reset()
    env.simulate(tf.constant([0, 1]))
    np.testing.assert_array_equal(env.action.numpy(), [0, 1])
    batch_env.close()


def test_wrong_action_shape_is_an_error():
    env = InGraphBatchEnv(_batch([2, 2]))
    env.reset()
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        env.simulate(tf.zeros([2, 3]))


def test_results_of_the_wrong_shape_are_an_error_naming_them():
    class ShortReward(BatchEnv):
        def step(self, actions):
            observ, reward, terminated, truncated, infos = super().step(actions)
            return observ, reward[:1], terminated, truncated, infos

    env = InGraphBatchEnv(ShortReward([MockEnvironment((3,), (2,), 5, 5) for _ in range(2)],
                                      blocking=True))
    env.reset()
    with pytest.raises(tf.errors.InvalidArgumentError, match="reward of shape"):
        tf.function(env.simulate)(tf.zeros([2, 2]))
    assert isinstance(env.error, ValueError) and "expected (2,)" in str(env.error)

"""Tests of batchrl.environments.local.BatchEnv, in-process and with external processes."""

import functools
import sys

import cloudpickle
import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.environments.wrappers import ExternalProcess, WorkerError, standard_wrappers

# Environments defined here are sent to workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_pendulum():
    return standard_wrappers(gymnasium.make("Pendulum-v1"))


class BadValueEnv(gymnasium.Env):
    """Returns a bad observation or reward at the given step (counted from 1)."""

    def __init__(self, bad_step=None, observ_value=np.nan, reward_value=0.0, fail_step=False):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.bad_step = bad_step
        self.observ_value = observ_value
        self.reward_value = reward_value
        self.fail_step = fail_step
        self.count = 0
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.count += 1
        if self.fail_step:
            raise RuntimeError("step-failed-in-bad-env")
        observ = np.full(2, self.count, np.float32)
        reward = float(self.count)
        if self.count == self.bad_step:
            observ[1] = self.observ_value
            reward = self.reward_value
        return observ, reward, False, False, {"count": self.count}

    def close(self):
        self.closed = True


class FailingCloseEnv(BadValueEnv):
    def close(self):
        raise OSError("close-failed")


def run(batch_env, actions, seed):
    """Resets with `seed` and steps with every action; returns all outputs."""
    outputs = [batch_env.reset(seed=seed)[0]]
    for action in actions:
        outputs.append(batch_env.step(action)[:4])
    # A partial reset in the middle.
    outputs.append(batch_env.reset([2, 0], seed=seed + 100)[0])
    for action in actions[:5]:
        outputs.append(batch_env.step(action)[:4])
    return outputs


def test_blocking_and_external_processes_give_identical_results():
    size = 4
    actions = np.random.default_rng(1).uniform(-1.5, 1.5, (30, size, 1)).astype(np.float32)
    with BatchEnv([make_pendulum() for _ in range(size)], blocking=True) as local:
        expected = run(local, actions, seed=5)
    external = [ExternalProcess(make_pendulum, name=f"env {i} (Pendulum-v1)") for i in range(size)]
    with BatchEnv(external, blocking=False) as remote:
        assert len(remote) == size
        assert remote[1] is external[1]
        assert remote.observation_space == spaces.Box(
            np.array([-1, -1, -8], np.float32), np.array([1, 1, 8], np.float32)
        )
        assert remote.action_space == spaces.Box(-1.0, 1.0, (1,), np.float32)
        got = run(remote, actions, seed=5)
    assert all(not env._process.is_alive() for env in external)
    assert len(got) == len(expected)
    for out_got, out_expected in zip(got, expected, strict=True):
        if isinstance(out_got, np.ndarray):
            np.testing.assert_array_equal(out_got, out_expected)
        else:
            for a, b in zip(out_got, out_expected, strict=True):
                np.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype
    # Different seeds give different observations.
    assert not np.array_equal(expected[0][0], expected[0][1])


def test_output_shapes_and_dtypes():
    envs = [MockEnvironment((3, 2), (4,), 2, 2) for _ in range(5)]
    batch_env = BatchEnv(envs, blocking=True)
    observ, infos = batch_env.reset(seed=0)
    assert observ.shape == (5, 3, 2) and observ.dtype == np.float32
    assert infos == ({},) * 5
    observ, reward, terminated, truncated, infos = batch_env.step(np.zeros((5, 4)))
    assert observ.shape == (5, 3, 2) and observ.dtype == np.float32
    assert reward.shape == (5,) and reward.dtype == np.float32
    assert terminated.shape == (5,) and terminated.dtype == bool
    assert truncated.shape == (5,) and truncated.dtype == bool
    assert isinstance(infos, tuple) and len(infos) == 5
    _, _, terminated, truncated, _ = batch_env.step(np.zeros((5, 4)))
    assert terminated.all() and not truncated.any()


def test_reset_of_a_subset_only_touches_those_envs():
    envs = [MockEnvironment((2,), (1,), 10, 10) for _ in range(4)]
    batch_env = BatchEnv(envs, blocking=True)
    batch_env.reset()
    batch_env.step(np.zeros((4, 1)))
    observ, infos = batch_env.reset(np.array([3, 1], np.int32))
    assert observ.shape == (2, 2) and len(infos) == 2
    assert [env.steps for env in envs] == [[1], [1, 0], [1], [1, 0]]
    batch_env.step(np.zeros((4, 1)))
    assert [env.steps for env in envs] == [[2], [1, 1], [2], [1, 1]]
    observ, infos = batch_env.reset([])
    assert observ.shape == (0, 2) and observ.dtype == np.float32 and infos == ()
    assert [len(env.steps) for env in envs] == [1, 2, 1, 2]
    with pytest.raises(IndexError, match="batch index 4"):
        batch_env.reset([0, 4])
    with pytest.raises(IndexError, match="batch index -1"):
        batch_env.reset([-1])
    assert [len(env.steps) for env in envs] == [1, 2, 1, 2]


def test_reset_seeds_each_env_with_seed_plus_index():
    envs = [MockEnvironment((2,), (1,), 1, 100) for _ in range(3)]
    batch_env = BatchEnv(envs, blocking=True)
    observ, _ = batch_env.reset([2, 0], seed=40)
    np.testing.assert_array_equal(observ[0], MockEnvironment((2,), (1,), 1, 100).reset(seed=42)[0])
    np.testing.assert_array_equal(observ[1], MockEnvironment((2,), (1,), 1, 100).reset(seed=40)[0])


def test_mismatched_spaces_raise():
    observ_envs = [MockEnvironment((2,), (1,), 1, 1), MockEnvironment((3,), (1,), 1, 1)]
    with pytest.raises(ValueError, match=r"observation space of env 1 .*\(3,\).*env 0.*\(2,\)"):
        BatchEnv(observ_envs, blocking=True)
    action_envs = [MockEnvironment((2,), (1,), 1, 1)] * 2 + [MockEnvironment((2,), (2,), 1, 1)]
    with pytest.raises(ValueError, match=r"action space of env 2 .*\(2,\).*env 0.*\(1,\)"):
        BatchEnv(action_envs, blocking=True)
    with pytest.raises(ValueError):
        BatchEnv([], blocking=True)


def test_wrong_action_shape_raises():
    batch_env = BatchEnv([MockEnvironment((2,), (3,), 1, 1) for _ in range(2)], blocking=True)
    batch_env.reset()
    with pytest.raises(ValueError, match=r"expected actions of shape \(2, 3\).*got shape \(3,\)"):
        batch_env.step(np.zeros(3))
    with pytest.raises(ValueError, match=r"\(2, 3\).*got shape \(2, 3, 1\)"):
        batch_env.step(np.zeros((2, 3, 1)))
    assert [env.steps for env in batch_env] == [[0], [0]]


def test_discrete_actions():
    batch_env = BatchEnv([gymnasium.make("CartPole-v1") for _ in range(3)], blocking=True)
    observ, _ = batch_env.reset(seed=0)
    assert observ.shape == (3, 4)
    observ, reward, *_ = batch_env.step(np.array([0, 1, 1]))
    assert observ.shape == (3, 4) and reward.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"expected actions of shape \(3,\)"):
        batch_env.step(np.array([[0], [1], [1]]))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_observation_names_the_env(value):
    envs = [BadValueEnv(), BadValueEnv(), BadValueEnv(bad_step=2, observ_value=value)]
    batch_env = BatchEnv(envs, blocking=True)
    batch_env.reset()
    batch_env.step(np.zeros((3, 1)))
    with pytest.raises(ValueError, match=rf"env 2 .*observation.*\[ *2\., +{value}\]"):
        batch_env.step(np.zeros((3, 1)))


def test_non_finite_reward_names_the_env():
    envs = [BadValueEnv(), BadValueEnv(bad_step=1, observ_value=0.0, reward_value=np.nan)]
    batch_env = BatchEnv(envs, blocking=True)
    batch_env.reset()
    with pytest.raises(ValueError, match="env 1 .*reward: nan"):
        batch_env.step(np.zeros((2, 1)))


def test_non_finite_reset_observation_names_the_env():
    class NanResetEnv(BadValueEnv):
        def reset(self, *, seed=None, options=None):
            return np.array([0.0, np.nan], np.float32), {}

    batch_env = BatchEnv([BadValueEnv(), BadValueEnv(), NanResetEnv()], blocking=True)
    with pytest.raises(ValueError, match="env 2 .*non-finite observation"):
        batch_env.reset([0, 2])


def test_worker_error_in_parallel_step_keeps_the_other_envs_in_sync():
    external = [
        ExternalProcess(BadValueEnv, name="env 0 (good)"),
        ExternalProcess(functools.partial(BadValueEnv, fail_step=True), name="env 1 (bad)"),
        ExternalProcess(BadValueEnv, name="env 2 (good)"),
    ]
    with BatchEnv(external, blocking=False) as batch_env:
        batch_env.reset()
        with pytest.raises(WorkerError, match=r"env 1 \(bad\)(.|\n)*step-failed-in-bad-env"):
            batch_env.step(np.zeros((3, 1)))
        # The good envs' answers to the failed batch step were collected: the next answers
        # are those of the next requests.
        assert batch_env[0].count == 1 and batch_env[2].count == 1
        observ, _ = batch_env.reset([0, 2])
        assert observ.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_close_closes_every_env_even_if_one_fails():
    envs = [BadValueEnv(), FailingCloseEnv(), BadValueEnv()]
    batch_env = BatchEnv(envs, blocking=True)
    with pytest.raises(OSError, match="close-failed"):
        batch_env.close()
    assert envs[0].closed and envs[2].closed
    envs = [BadValueEnv(), BadValueEnv()]
    with BatchEnv(envs, blocking=True):
        pass
    assert all(env.closed for env in envs)


class SpaceEnv(gymnasium.Env):
    """Accepts any action of `action_space` and counts its steps."""

    def __init__(self, action_space):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = action_space
        self.actions = []

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.actions.append(np.asarray(action).tolist())
        return np.zeros(2, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("space, good, bad, message", [
    (spaces.MultiDiscrete([3, 2]), [[2, 1], [0, 0]], [[2, 1], [0, 2]],
     r"^env 1 was given the action \[0, 2\], outside the action space MultiDiscrete"),
    (spaces.MultiDiscrete([3, 2], start=[-1, 5]), [[1, 6], [-1, 5]], [[-2, 5], [0, 5]],
     r"^env 0 was given the action \[-2, 5\], outside"),
    (spaces.MultiBinary(3), [[1, 0, 1], [0, 0, 0]], [[1, 0, 1], [0, 3, 0]],
     r"^env 1 was given the action \[0, 3, 0\], outside the action space MultiBinary\(3\)"),
    (spaces.Discrete(3, start=-1), [-1, 1], [2, 0],
     r"^env 0 was given the action 2, outside the action space Discrete\(3, start=-1\)"),
])
def test_integer_actions_outside_their_space_are_refused(space, good, bad, message):
    envs = [SpaceEnv(space) for _ in range(2)]
    batch_env = BatchEnv(envs, blocking=True)
    batch_env.reset()
    with pytest.raises(ValueError, match=message):
        batch_env.step(np.array(bad))
    with pytest.raises(ValueError, match=r"convertible to int\d+ .*got dtype float64"):
        batch_env.step(np.array(good, np.float64))
    assert [env.actions for env in envs] == [[], []]  # Nothing was stepped.
    batch_env.step(np.array(good))
    assert [env.actions for env in envs] == [[good[0]], [good[1]]]
    assert all(space.contains(np.asarray(action)) for action in good)  # Gymnasium agrees.
    assert not all(space.contains(np.asarray(action)) for action in bad)

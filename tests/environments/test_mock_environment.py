"""Tests of batchrl.environments.mock.MockEnvironment."""

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrl.environments.mock import MockEnvironment


def run_episode(env, seed=None):
    """Resets and steps until the episode ends; returns the list of step results."""
    env.reset(seed=seed)
    results = []
    while True:
        results.append(env.step(np.zeros(env.action_space.shape, np.float32)))
        if results[-1][2] or results[-1][3]:
            return results


def test_spaces_and_observations():
    env = MockEnvironment((3, 2), (4,), 1, 5)
    assert isinstance(env, gymnasium.Env)
    assert env.observation_space == spaces.Box(-1.0, 1.0, (3, 2), np.float32)
    assert env.action_space == spaces.Box(-1.0, 1.0, (4,), np.float32)
    observ, info = env.reset(seed=0)
    assert observ.shape == (3, 2) and observ.dtype == np.float32
    assert env.observation_space.contains(observ)
    assert info == {}
    observ, reward, terminated, truncated, info = env.step(np.zeros(4, np.float32))
    assert observ.shape == (3, 2) and observ.dtype == np.float32
    assert isinstance(reward, float) and -1.0 <= reward < 1.0
    assert isinstance(terminated, bool) and isinstance(truncated, bool)


def test_steps_and_durations_are_recorded():
    env = MockEnvironment((2,), (1,), 2, 6)
    assert env.steps == [] and env.durations == []
    lengths = []
    for seed in range(5):
        lengths.append(len(run_episode(env, seed)))
    assert env.durations == lengths
    assert env.steps == lengths
    assert all(2 <= length <= 6 for length in lengths)
    env.reset()
    assert env.steps[-1] == 0 and len(env.steps) == 6 and len(env.durations) == 6
    env.step(np.zeros(1))
    assert env.steps[-1] == 1
    # A reset in the middle of an episode starts a new entry.
    env.reset()
    assert env.steps[-2:] == [1, 0]


def test_durations_cover_the_range():
    env = MockEnvironment((1,), (1,), 3, 5)
    env.reset(seed=123)
    for _ in range(200):
        env.reset()
    assert set(env.durations) == {3, 4, 5}


def test_seeded_reset_is_repeatable():
    a = MockEnvironment((2,), (1,), 1, 50)
    b = MockEnvironment((2,), (1,), 1, 50)
    for seed in (0, 1, 2):
        episode_a, episode_b = run_episode(a, seed), run_episode(b, seed)
        assert len(episode_a) == len(episode_b)
        for step_a, step_b in zip(episode_a, episode_b, strict=True):
            np.testing.assert_array_equal(step_a[0], step_b[0])
            assert step_a[1:4] == step_b[1:4]
    assert a.durations == b.durations
    assert len(set(a.durations)) > 1  # Different seeds give different lengths here.


def test_terminated_or_truncated_on_the_last_step():
    env = MockEnvironment((1,), (1,), 3, 3)
    episode = run_episode(env)
    assert [step[2] for step in episode] == [False, False, True]
    assert [step[3] for step in episode] == [False, False, False]
    env = MockEnvironment((1,), (1,), 3, 3, truncate=True)
    episode = run_episode(env)
    assert [step[2] for step in episode] == [False, False, False]
    assert [step[3] for step in episode] == [False, False, True]


def test_step_before_reset_or_after_the_end_raises():
    env = MockEnvironment((1,), (1,), 2, 2)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(1))
    run_episode(env)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(np.zeros(1))
    assert env.steps == [2]  # The refused step is not counted.
    env.reset()
    env.step(np.zeros(1))
    assert env.steps == [2, 1]


def test_wrong_action_shape_raises():
    env = MockEnvironment((1,), (2,), 2, 2)
    env.reset()
    with pytest.raises(ValueError, match=r"shape \(2,\).*\(3,\)"):
        env.step(np.zeros(3))
    with pytest.raises(ValueError):
        env.step(0.0)
    assert env.steps == [0]


@pytest.mark.parametrize("durations", [(0, 1), (3, 2), (-1, 5)])
def test_invalid_durations_raise(durations):
    with pytest.raises(ValueError, match="min_duration"):
        MockEnvironment((1,), (1,), *durations)


@settings(max_examples=50, deadline=None)
@given(
    min_duration=st.integers(1, 10),
    extra=st.integers(0, 10),
    seed=st.integers(0, 2**31 - 1),
    truncate=st.booleans(),
)
def test_episode_length_property(min_duration, extra, seed, truncate):
    env = MockEnvironment((2,), (), min_duration, min_duration + extra, truncate=truncate)
    episode = run_episode(env, seed)
    assert min_duration <= len(episode) <= min_duration + extra
    assert env.durations == [len(episode)] and env.steps == [len(episode)]
    ends = [step[3] if truncate else step[2] for step in episode]
    assert ends == [False] * (len(episode) - 1) + [True]

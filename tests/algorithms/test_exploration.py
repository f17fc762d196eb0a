"""The exploration of `batchrl.algorithms.exploration` against its spec: epsilon's schedule
and the frequency of random actions, Gaussian noise's standard deviation and clipping
(statistics over many draws, tolerances of 5 standard errors of the sample size), and
Ornstein-Uhlenbeck noise per agent (the recurrence against NumPy with the same draws, reset
at an episode's start)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms import exploration
from batchrl.algorithms.td3 import TD3
from tests import off_policy_numpy as ref

DRAWS = 20000
EPSILON = {"type": "epsilon_decay", "initial": 1.0, "final": 0.05, "steps": 1000}


def _explore(spec, action, steps=0, discrete=False, num_actions=None, seed=0):
    explorer = exploration.Exploration(exploration.parse(spec, discrete), len(action),
                                       np.shape(action)[1:], num_actions)
    agents = tf.range(len(action))
    return explorer(agents, tf.constant(action), tf.constant(steps, tf.int64),
                    tf.random.Generator.from_seed(seed)).numpy()


@pytest.mark.parametrize("steps", [0, 500, 1000, 3000])
def test_epsilon_falls_linearly_to_final_over_its_steps_then_stays(steps):
    """epsilon = initial + min(t / steps, 1) (final - initial) at 0, half, all and three
    times the schedule's steps; the greedy action (0 of 10) is replaced with probability
    epsilon by a uniform one, so 9/10 of epsilon of the actions differ. Catches: the
    schedule reversed; no floor at `final` past its steps; exploring where a draw is above
    epsilon."""
    expected = 1.0 + min(steps / 1000, 1.0) * (0.05 - 1.0)
    spec = exploration.parse(EPSILON, discrete=True)
    np.testing.assert_allclose(float(exploration.epsilon(spec, tf.constant(steps))),
                               expected, rtol=1e-6)
    action = _explore(EPSILON, np.zeros(DRAWS, np.int32), steps, True, 10)
    assert set(np.unique(action)) <= set(range(10))
    changed = 0.9 * expected
    tolerance = 5 * math.sqrt(changed * (1 - changed) / DRAWS)
    assert abs((action != 0).mean() - changed) < tolerance


def test_gaussian_noise_has_the_spec_standard_deviation():
    """Noise of std 0.15 on actions 0 (the bounds 6.7 std away: never clipped in
    practice): mean 0, std 0.15 and elements uncorrelated within 5 standard errors.
    Catches: the variance used as the std; one draw per action row."""
    noise = _explore({"type": "gaussian", "std": 0.15}, np.zeros((DRAWS, 2), np.float32))
    assert np.abs(noise).max() < 1
    assert abs(noise.mean()) < 5 * 0.15 / math.sqrt(2 * DRAWS)
    assert abs(noise.std() - 0.15) < 5 * 0.15 / math.sqrt(2 * 2 * DRAWS)
    assert abs(np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]) < 5 / math.sqrt(DRAWS)


@pytest.mark.parametrize("bound", [1.0, -1.0])
def test_gaussian_noise_is_clipped_to_the_action_bounds(bound):
    """Actions 0.9 (-0.9) with noise of std 0.3: none leaves [-1, 1], the share at the
    bound is P(N(0, 0.3) > 0.1), and the mean that of the clipped normal, 0.9 + 0.3
    (c (1 - Phi(c)) - phi(c)) with c = 1/3, each within 5 standard errors. Catches: no
    clip; a clip to [-0.9, 0.9]; the clip of the noise alone."""
    action = np.full((DRAWS, 1), 0.9 * bound, np.float32)
    explored = _explore({"type": "gaussian", "std": 0.3}, action)
    assert np.abs(explored).max() <= 1.0
    c = 0.1 / 0.3
    above = 0.5 * math.erfc(c / math.sqrt(2))  # 1 - Phi(c) = 0.369
    tolerance = 5 * math.sqrt(above * (1 - above) / DRAWS)
    assert abs((explored == bound).mean() - above) < tolerance
    mean = 0.9 + 0.3 * (c * above - math.exp(-c * c / 2) / math.sqrt(2 * math.pi))
    assert abs(explored.mean() - bound * mean) < 5 * 0.3 / math.sqrt(DRAWS)


def test_ornstein_uhlenbeck_noise_follows_its_recurrence_per_agent_and_resets_at_an_episode():
    """TD3 acting with OU noise (theta 0.5, std 0.3, dt 0.1) for two agents: the explored
    action minus the greedy one follows x <- x - theta x dt + std sqrt(dt) N(0, 1) in NumPy
    with the same draws (a clone of the algorithm's generator); `begin_episodes` of agent 0
    zeroes its noise and keeps agent 1's. Catches: the reset of every agent; no reset at an
    episode's start; the mean reversion's sign; dt in place of sqrt(dt); the state not kept
    between steps."""
    spec = {"type": "ornstein_uhlenbeck", "theta": 0.5, "std": 0.3, "dt": 0.1}
    algo = ref.build(TD3, ref.mock_env(action_size=2), exploration=spec)
    observ = tf.constant(np.random.default_rng(0).normal(size=(2, 3)), tf.float32)
    agents = tf.range(2)
    greedy, _ = algo.policy_action(observ, tf.zeros([2, 0]))
    state = np.zeros((2, 2))
    for step in range(6):
        if step == 4:
            algo.begin_episodes(tf.constant([0]))
            state[0] = 0.0
        draws = ref.clone(algo._random).normal([2, 2]).numpy()
        state = state - 0.5 * state * 0.1 + 0.3 * math.sqrt(0.1) * draws
        noise = algo.perform(agents, observ).numpy() - greedy.numpy()
        assert (np.abs(greedy.numpy() + state) < 1).all()  # Not clipped.
        np.testing.assert_allclose(noise, state, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
    assert np.abs(state[1]).max() > 0.15  # Agent 1's kept state matters.

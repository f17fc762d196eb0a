"""`batchrl.Agent`'s episodes: where training episodes begin and end around deterministic
steps, resets and errors, the episode limit, the recurrent deterministic state, and an
Agent that leaves the process's random generators and eager mode alone."""

import random

import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl.agent import Agent
from batchrl.configs import ConfigError
from tests.agent_fixtures import ACTION, OBSERVATION, SMALL, Feed, make_agent, play


def _stored(agent):
    """The episodes in the algorithm's memory, oldest first: `(rewards, terminated, final
    observation)` each (the final observation normalized, so raw under
    `normalize_observ: false`)."""
    algo = agent._algo
    count = int(algo._memory_index.numpy())
    episodes, length = algo._memory.data()
    rewards = episodes["reward"].numpy()
    return [(rewards[row, :size], bool(algo._memory_terminated[row]),
             algo._memory_final[row].numpy())
            for row, size in enumerate(length.numpy()[:count])]


class _Recorder:
    """Sampled steps of 3 environments with random observations, rewards and final
    observations, remembered to compare with what the agent stores."""

    def __init__(self, agent, seed=0):
        self._agent = agent
        self._random = np.random.default_rng(seed)
        self.rewards, self.finals = [], []

    def observation(self):
        return self._random.normal(size=(3, 3)).astype(np.float32)

    def step(self, terminated=(False, False, False)):
        self._agent.act(self.observation())
        reward = self._random.normal(size=3).astype(np.float32)
        final = self.observation()
        self.rewards.append(reward)
        self.finals.append(final)
        return self._agent.observe(reward, np.array(terminated), np.zeros(3, bool),
                                   final_observation=final)

    def episode(self, env, first, last, terminated):
        """The expected stored episode of environment `env`: steps `first` to `last`
        (inclusive, counted from 0)."""
        rewards = np.array([reward[env] for reward in self.rewards[first:last + 1]])
        return rewards, terminated, self.finals[last][env]


def _assert_stored(agent, expected):
    stored = _stored(agent)
    assert len(stored) == len(expected), [len(rewards) for rewards, _, _ in stored]
    for index, (ours, theirs) in enumerate(zip(stored, expected, strict=True)):
        np.testing.assert_array_equal(ours[0], theirs[0], err_msg=f"rewards of {index}")
        assert ours[1] == theirs[1], f"terminated of episode {index}"
        np.testing.assert_array_equal(ours[2], theirs[2], err_msg=f"final of {index}")


def test_deterministic_steps_and_resets_end_the_training_episodes_in_progress():
    """Deterministic steps, then resets, of one agent.

    30 deterministic steps in the middle of the training episodes (the application then
    resets its environments) and sampled steps again: the stored episodes end where the
    deterministic steps began, as truncated (bootstrapped from the last final observation),
    and the next ones begin after them; no stored episode holds a step of both sides.

    Then `reset` ends the training episodes of the given environments."""
    agent = make_agent(update_every=20, max_length=50, normalize_observ=False)
    recorder = _Recorder(agent)
    for _ in range(5):
        recorder.step()
    for _ in range(30):
        agent.act(recorder.observation(), deterministic=True)
        agent.observe(np.ones(3), np.zeros(3, bool), np.zeros(3, bool))
    for _ in range(3):
        recorder.step()
    recorder.step(terminated=(True, True, True))
    before = [recorder.episode(env, 0, 4, False) for env in range(3)] + [
        recorder.episode(env, 5, 8, True) for env in range(3)]
    _assert_stored(agent, before)

    recorder = _Recorder(agent, seed=1)  # No episode in progress: all ended above.
    for _ in range(4):
        recorder.step()
    agent.reset([1])
    _assert_stored(agent, before + [recorder.episode(1, 0, 3, False)])
    recorder.step()
    recorder.step(terminated=(True, True, True))
    expected = before + [recorder.episode(1, 0, 3, False), recorder.episode(0, 0, 5, True),
                         recorder.episode(1, 4, 5, True), recorder.episode(2, 0, 5, True)]
    _assert_stored(agent, expected)
    agent.reset()  # No episode in progress: nothing to store.
    _assert_stored(agent, expected)
    with pytest.raises(ValueError, match=r"indices \[3\] outside \[0, 3\)"):
        agent.reset([3])
    with pytest.raises(ValueError, match=r"indices \[0\] given twice"):
        agent.reset([0, 0])
    agent.act(recorder.observation())
    with pytest.raises(RuntimeError, match=r"reset\(\) between act\(\) and observe\(\)"):
        agent.reset()


NO_LIMIT = {key: value for key, value in SMALL.items() if key != "max_length"}


def test_the_episode_limit_is_max_length_never_the_configs_env():
    """Without `max_length` the Agent refuses, whatever the config's `env` (the default
    config's Pendulum-v1 has 200 steps, cartpole's CartPole-v1 500): the application's
    environments are not the config's. With it (an override of a config without it), the
    limit is `max_length`: test_an_episode_past_max_length_is_dropped_and_the_agent_goes_on."""
    message = r"^batchrl.Agent needs config key 'max_length'"
    with pytest.raises(ConfigError, match=message):
        Agent.create(NO_LIMIT, OBSERVATION, ACTION, num_envs=2)
    with pytest.raises(ConfigError, match=message):
        Agent.create("cartpole", OBSERVATION, spaces.Discrete(2), num_envs=2)


def test_an_episode_past_max_length_is_dropped_and_the_agent_goes_on():
    """Environment 0 runs past max_length=3 (given to a config without it, whose env's
    episodes last 200 steps) at step 4: the error names it, its episode is dropped, the
    step of the others is recorded, and act / observe go on; environment 0's next episode
    begins at the next act."""
    agent = Agent.create(NO_LIMIT, OBSERVATION, ACTION, num_envs=3, max_length=3,
                         update_every=20, normalize_observ=False)
    recorder = _Recorder(agent)
    never, one, two = (False, False, False), (False, True, False), (False, False, True)
    for terminated in (never, one, two):
        recorder.step(terminated)
    step = agent.step
    with pytest.raises(ValueError, match=r"environments \[0\] passed max_length=3 steps") as error:
        recorder.step(one)
    recorder.step(never)
    done = recorder.step((True, True, True))
    assert done.tolist() == [True, True, True]
    assert agent.step == step + 3 * 3  # The step of the error counts.
    _assert_stored(agent, [
        recorder.episode(1, 0, 1, True), recorder.episode(2, 0, 2, True),
        recorder.episode(1, 2, 3, True), recorder.episode(0, 4, 5, True),
        recorder.episode(1, 4, 5, True), recorder.episode(2, 3, 5, True)])
    assert "were dropped" in str(error.value)


def test_create_and_load_leave_the_process_random_generators_and_eager_mode_alone(tmp_path):
    """Python's, NumPy's and TensorFlow's global generators draw on as if no Agent had been
    created or loaded; the weights still follow from `seed` alone; `eager` switches only
    the Agent's own calls."""

    def seed_all():
        random.seed(123)
        np.random.seed(123)
        tf.random.set_seed(123)

    def draws():
        return random.random(), float(np.random.random()), float(tf.random.uniform([]))

    seed_all()
    draws()
    expected = draws()
    seed_all()
    draws()
    agent = make_agent(seed=4)
    assert draws() == expected
    agent.save(tmp_path / "agent")
    seed_all()
    draws()
    Agent.load(tmp_path / "agent")
    assert draws() == expected

    random.seed(7)  # Another state of the global generators: the same weights.
    twin = make_agent(seed=4)
    for ours, theirs in zip(agent._algo.networks.policy.weights,
                            twin._algo.networks.policy.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    other = make_agent(seed=5)
    assert not np.array_equal(agent._algo.networks.policy.weights[0].numpy(),
                              other._algo.networks.policy.weights[0].numpy())

    assert not tf.config.functions_run_eagerly()
    eager = make_agent(eager=True)
    play(eager, Feed(3), 2)
    assert not tf.config.functions_run_eagerly()
    assert eager._act_sampled.experimental_get_tracing_count() == 0  # Ran eagerly.
    tf.config.run_functions_eagerly(True)
    try:
        traced = make_agent()  # Deterministic steps: act and observe, with small traces.
        for _ in range(2):
            traced.act(np.zeros((3, 3)), deterministic=True)
            traced.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool))
        assert tf.config.functions_run_eagerly()
        assert traced._act_deterministic.experimental_get_tracing_count() == 1
        assert traced._reset_eval_state.experimental_get_tracing_count() == 1
    finally:
        tf.config.run_functions_eagerly(False)


def _hand_run(agent, observation, state):
    """The mean action of the agent's policy network for `observation` from the recurrent
    `state`, mapped to ACTION's bounds with NumPy, and the next state."""
    algo = agent._algo
    normalized = algo._observ_filter.transform(observation)
    params, state = algo.networks.policy(normalized[:, None], tf.constant(state))
    mean = np.clip(params["mean"].numpy()[:, 0], -1.0, 1.0)
    return ACTION.low + (mean + 1.0) / 2.0 * (ACTION.high - ACTION.low), state.numpy()


def test_recurrent_deterministic_state_over_steps_resets_and_load(tmp_path):
    """The deterministic actions of a recurrent agent equal a hand-run of its policy network
    whose state starts at zero, is carried from step to step (and over sampled steps in
    between), and is zeroed where an episode ends in `observe`, by `reset(indices)`, and
    by `reset()` before a second evaluation; `save` / `load` carry it over."""
    agent = make_agent(network="recurrent_gaussian", update_every=50)
    play(agent, Feed(3), 4)  # Moves the observation normalizer off the identity.
    rng = np.random.default_rng(1)
    state = np.zeros((3, agent._algo.state_size), np.float32)
    assert state.shape[1] > 0

    def evaluate(terminated=(False, False, False)):
        nonlocal state
        observation = rng.normal(size=(3, 3)).astype(np.float32)
        action = agent.act(observation, deterministic=True)
        expected, state = _hand_run(agent, observation, state)
        np.testing.assert_allclose(action, expected, atol=1e-5)
        agent.observe(np.zeros(3), np.array(terminated), np.zeros(3, bool))
        state[np.array(terminated)] = 0.0

    for _ in range(3):
        evaluate()
    evaluate((False, True, False))  # Environment 1's episode ends.
    evaluate()
    play(agent, Feed(3, seed=3), 2)  # Sampled steps leave the deterministic state alone.
    evaluate()
    agent.reset([2])
    state[2] = 0.0
    evaluate()
    evaluate()
    agent.reset()  # A second evaluation begins from the zero state everywhere.
    state[:] = 0.0
    evaluate()
    evaluate()
    agent.save(tmp_path / "agent")
    loaded = Agent.load(tmp_path / "agent")
    observation = rng.normal(size=(3, 3)).astype(np.float32)
    expected, _ = _hand_run(agent, observation, state)
    np.testing.assert_allclose(loaded.act(observation, deterministic=True), expected, atol=1e-5)
    np.testing.assert_allclose(agent.act(observation, deterministic=True), expected, atol=1e-5)

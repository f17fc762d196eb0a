"""What an exported off-policy model's signatures do with exploration (docs/algorithms.md,
`batchrl.algorithms.exploration`): `serving_default` never explores; `sample` draws as
training acts, without state: DQN epsilon-greedy with the schedule's final epsilon, TD3 its
action plus normal noise of the exploration's `std`, both deterministic with `{type: none}`."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import batchrl

SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SMALL = {"value_layers": [8], "policy_layers": [8], "max_length": 10}
COUNT = 4000


def _served(algorithm, actions, exploration, tmp_path):
    """The exported model's `serving_default` and `sample` actions for COUNT copies of one
    observation."""
    agent = batchrl.Agent.create({"algorithm": algorithm, "exploration": exploration,
                                  **SMALL}, SPACE, actions, num_envs=1)
    model = tf.saved_model.load(str(agent.export(tmp_path / "model")))
    observation = tf.constant(np.tile([[0.3, -0.2, 0.5]], (COUNT, 1)), tf.float32)
    return tuple(model.signatures[name](observation=observation)["action"].numpy()
                 for name in ("serving_default", "sample"))


def test_dqn_samples_epsilon_greedy_with_the_final_epsilon(tmp_path):
    greedy, sampled = _served("dqn", gym.spaces.Discrete(4), {
        "type": "epsilon_decay", "initial": 1.0, "final": 0.4, "steps": 100}, tmp_path)
    assert len(set(greedy.tolist())) == 1
    # A random action with probability 0.4, the greedy one among the 4 a quarter of the
    # time: 0.4 * 3 / 4 = 0.3 of the actions differ from it (binomial std 0.007).
    assert abs(np.mean(sampled != greedy) - 0.3) < 0.03
    assert set(sampled.tolist()) == {0, 1, 2, 3}


def test_td3_samples_its_action_plus_normal_noise_of_the_explorations_std(tmp_path):
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    greedy, sampled = _served("td3", box, {"type": "gaussian", "std": 0.2}, tmp_path)
    assert np.abs(greedy).max() < 0.5  # Noise of 0.2 is seldom clipped at the bounds.
    noise = sampled - greedy
    assert abs(noise.std() - 0.2) < 0.01 and abs(noise.mean()) < 0.01


@pytest.mark.parametrize("algorithm, actions", [
    ("dqn", gym.spaces.Discrete(4)), ("td3", gym.spaces.Box(-1.0, 1.0, (2,), np.float32))])
def test_without_exploration_sample_is_the_deterministic_action(algorithm, actions,
                                                                tmp_path):
    greedy, sampled = _served(algorithm, actions, {"type": "none"}, tmp_path)
    np.testing.assert_array_equal(sampled, greedy)

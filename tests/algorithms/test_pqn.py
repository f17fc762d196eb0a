"""PQN (`batchrl.algorithms.pqn`): its Q(lambda) targets, its epsilon-greedy acting half and
one update, each against NumPy; the declared `layer_norm` by value; MultiDiscrete actions.
A learner fed an actor's fragments ends as PQN in one process:
tests/distributed/test_fragment.py."""

import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl import configs
from batchrl.algorithms import pqn
from batchrl.networks import feed_forward_categorical, feed_forward_composite, spec
from batchrl.networks.torso import Torso
from batchrl.spaces.graph import policy_action_space

GAMMA, LAMBDA = 0.9, 0.7
PQN = {"algorithm": "pqn", "network": "feed_forward_categorical"}


def _numpy_q_lambda(reward, value, next_value, terminated, done, length):
    """Gallici et al. 2025's recursion, backwards along each row: bootstrap from the value
    after the step alone where the episode or the row ends, else mix it with the return
    from the next step on."""
    target = np.zeros_like(reward)
    for row in range(reward.shape[0]):
        for t in reversed(range(length[row])):
            if done[row, t] or t == length[row] - 1:
                after = (1.0 - terminated[row, t]) * next_value[row, t]
            else:
                after = (1 - LAMBDA) * value[row, t + 1] + LAMBDA * target[row, t + 1]
            target[row, t] = reward[row, t] + GAMMA * after
    return target


def test_q_lambda_targets_follow_the_recursion_across_ends_and_row_boundaries():
    rng = np.random.default_rng(0)
    rows, time = 4, 7
    reward, value, next_value = (rng.normal(size=(rows, time)).astype(np.float32)
                                 for _ in range(3))
    done = np.zeros((rows, time), bool)
    terminated = np.zeros((rows, time), bool)
    done[0, 2] = terminated[0, 2] = True   # A terminal state inside a row: cut.
    done[1, 3] = True                       # A time limit inside a row: bootstrapped.
    done[2, 1] = terminated[2, 1] = done[2, 4] = True
    length = np.array([7, 7, 5, 3], np.int32)  # Rows 2 and 3 end early.
    got = pqn.q_lambda_returns(reward, value, next_value, terminated, done, length, GAMMA,
                               LAMBDA).numpy()
    want = _numpy_q_lambda(reward, value, next_value, terminated, done, length)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(got[3, 3:] == 0) and np.all(got[2, 5:] == 0)


def test_epsilon_decays_linearly_and_the_default_spans_a_tenth_of_the_run():
    config = configs.load("default", {**PQN, "steps": 50000, "exploration": None})
    spec = pqn.exploration_spec(config)
    assert (spec["initial"], spec["final"], spec["steps"]) == (1.0, 0.05, 5000)
    actor = _actor({"exploration": {"type": "epsilon_decay", "initial": 0.8, "final": 0.1,
                                    "steps": 1000}})
    for step, want in ((0, 0.8), (250, 0.8 - 0.25 * 0.7), (1000, 0.1), (5000, 0.1)):
        actor.step.assign(step)
        assert actor.epsilon().numpy() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("exploration", [{"type": "none"}, {"type": "gaussian", "std": 0.1}])
def test_exploration_other_than_epsilon_decay_is_a_config_error(exploration):
    config = configs.load("default", {**PQN, "rollout_length": 8,
                                      "exploration": exploration})
    with pytest.raises(configs.ConfigError, match="exploration"):
        pqn.PQN.check_config(config)
    with pytest.raises(configs.ConfigError, match="rollout_length"):
        pqn.PQN.check_config(configs.load("default", PQN))


def test_an_optimizer_that_does_not_step_on_gradients_is_a_config_error():
    with pytest.raises(configs.ConfigError, match="optimizer"):
        _pqn(_config(optimizer={"type": "natural_gradient"}))


def test_epsilon_greedy_explores_at_rate_epsilon_and_never_takes_a_forbidden_action():
    q = np.array([[0.0, 2.0, 1.0, -1e9]] * 20000, np.float32)  # Action 3 forbidden.
    generator = tf.random.Generator.from_seed(0)
    greedy = pqn.EpsilonGreedy({"logits": q}, 0.0)
    assert np.all(greedy.sample(generator).numpy() == 1)
    assert np.all(greedy.mode().numpy() == 1)
    uniform = pqn.EpsilonGreedy({"logits": q}, 1.0).sample(generator).numpy()
    np.testing.assert_allclose(np.bincount(uniform, minlength=4) / len(q),
                               [1 / 3, 1 / 3, 1 / 3, 0], atol=0.015)
    mixed = pqn.EpsilonGreedy({"logits": q}, 0.3).sample(generator).numpy()
    # Epsilon draws a uniform allowed action, which is the greedy one a third of the time.
    assert np.mean(mixed != 1) == pytest.approx(0.3 * 2 / 3, abs=0.015)
    # A MultiDiscrete space: each choice greedy in its own values.
    choices = np.array([[[0.0, 3.0], [5.0, -2.0]]], np.float32)
    assert pqn.EpsilonGreedy({"leaf0_logits": choices}, 0.0).mode().numpy().tolist() == [[1, 0]]


def test_a_multidiscrete_space_gets_a_q_head_per_choice_and_other_spaces_an_error():
    config = _config()
    config["network"] = feed_forward_composite
    # The flat actions of a MultiDiscrete space (`batchrl.spaces.graph`): float32 indices.
    actor = pqn.PQNActor(OBSERVATION, policy_action_space(spaces.MultiDiscrete([3, 2])),
                         config)
    observ = tf.constant(np.random.default_rng(4).normal(size=(400, 3)), tf.float32)
    state = tf.zeros([400, 0])
    explored, _ = actor.act(observ, state, explore=True)  # Epsilon 0.5.
    explored = explored.numpy()
    assert explored.shape == (400, 2) and explored.dtype == np.float32
    assert set(explored[:, 0]) == {0, 1, 2} and set(explored[:, 1]) == {0, 1}
    greedy, _ = actor.act(observ, state, explore=False)
    params, _ = actor.networks.policy(observ[:, None], state)
    (q,) = params.values()
    np.testing.assert_array_equal(greedy.numpy(), np.argmax(q.numpy()[:, 0], -1))
    value = actor.networks.value(observ[:, None]).numpy()[:, 0]
    np.testing.assert_allclose(value, q.numpy()[:, 0].max(-1).mean(-1), rtol=1e-6)
    with pytest.raises(configs.ConfigError, match="Discrete or MultiDiscrete"):
        pqn.PQNActor(OBSERVATION, spaces.Box(-1.0, 1.0, (2,), np.float32), config)


def test_layer_norm_normalizes_the_last_axis_with_a_learned_scale_and_offset():
    layers = spec.check_layers([{"type": "layer_norm"}])
    torso = Torso(layers, [], spaces.Box(-np.inf, np.inf, (5,), np.float32))
    x = np.random.default_rng(1).normal(2.0, 3.0, size=(2, 3, 5)).astype(np.float32)
    torso(x)
    (layer,) = torso._merged._declared
    gamma = np.linspace(0.5, 1.5, 5).astype(np.float32)
    beta = np.linspace(-1.0, 1.0, 5).astype(np.float32)
    layer.set_weights([gamma, beta])
    mean = x.mean(-1, keepdims=True)
    variance = x.var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(variance + layer.epsilon) * gamma + beta
    np.testing.assert_allclose(torso(x).numpy(), want, rtol=1e-4, atol=1e-5)


def _config(**overrides):
    config = configs.load("default", {
        **PQN, "policy_layers": [], "value_layers": [8], "rollout_length": 5,
        "update_epochs": 1, "optimizer": {"type": "sgd"}, "policy_lr": 0.1,
        "normalize_observ": False, "normalize_reward": False, "discount": GAMMA,
        "q_lambda": LAMBDA, "steps": 1000,
        "exploration": {"type": "epsilon_decay", "initial": 0.5, "final": 0.5, "steps": 1},
        **overrides})
    config.update(network=feed_forward_categorical, max_length=50)
    return config


OBSERVATION = spaces.Box(-np.inf, np.inf, (3,), np.float32)


def _actor(overrides=None):
    return pqn.PQNActor(OBSERVATION, spaces.Discrete(3), _config(**(overrides or {})))


def _pqn(config):
    from tests.distributed.test_fragment import _batch_env

    tf.keras.utils.set_random_seed(0)
    return pqn.PQN(_batch_env(num_actions=3), tf.Variable(0, dtype=tf.int64),
                   tf.Variable(True), tf.Variable(False), config)


def test_the_values_of_the_targets_are_the_maxima_of_the_q_values_acted_with():
    """V(s_t) = max_a Q(s_t, a) of the recorded steps comes from the Q values each step was
    acted with (`policy_logits`), not from a second pass of the network; zero beyond a
    row's length; V(s'_t) is the next step's inside the row."""
    algo = _pqn(_config())
    rng = np.random.default_rng(5)
    rows, time = 2, 4
    logits = rng.normal(size=(rows, time, 3)).astype(np.float32)
    length = np.array([4, 3], np.int32)
    recorded = {"action": np.zeros((rows, time), np.int32),
                "reward": np.zeros((rows, time), np.float32),
                "done": np.zeros((rows, time), bool),
                "terminated": np.zeros((rows, time), bool), "policy_logits": logits}
    observ = rng.normal(size=(rows, time, 3)).astype(np.float32)
    batch = algo._rollout_batch(recorded, tf.constant(observ), tf.constant(observ),
                                tf.constant(length))
    valid = np.arange(time)[None] < length[:, None]
    want = np.where(valid, logits.max(-1), 0.0)
    np.testing.assert_allclose(batch["value"].numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(batch["next_value"].numpy()[:, :2], want[:, 1:3], rtol=1e-6)


def test_one_update_is_a_gradient_step_on_the_squared_td_error_of_the_q_lambda_targets():
    """A linear Q network (no hidden layer) and plain SGD over the whole batch: after one
    update from a fragment (acted with these weights), the weights are those of a NumPy
    step on half the mean squared error of Q(s_t, a_t) against the Q(lambda) targets of
    the weights before."""
    algo = _pqn(_config())
    rng = np.random.default_rng(3)
    rows, time = 3, 5
    observ = rng.normal(size=(rows, time, 3)).astype(np.float32)
    next_observ = np.concatenate([observ[:, 1:], rng.normal(size=(rows, 1, 3))], 1)
    done = np.zeros((rows, time), bool)
    terminated = np.zeros((rows, time), bool)
    done[0, 1] = terminated[0, 1] = True
    done[1, 2] = True
    final = rng.normal(size=(2, 3)).astype(np.float32)  # The episodes' final observations.
    next_observ[0, 1], next_observ[1, 2] = final
    length = np.array([5, 5, 4], np.int32)
    fragment = {"observ": observ, "next_observ": next_observ.astype(np.float32),
                "action": rng.integers(0, 3, size=(rows, time)).astype(np.int32),
                "reward": rng.normal(size=(rows, time)).astype(np.float32),
                "done": done, "terminated": terminated, "length": length}
    kernel, bias = (weight.numpy() for weight in algo.networks.policy.trainable_variables)

    def q(x):
        return x @ kernel + bias

    # The Q values each step was acted with: V(s_t) of the targets is their maximum.
    fragment["policy_logits"] = q(observ).astype(np.float32)

    value, next_value = q(observ).max(-1), q(fragment["next_observ"]).max(-1)
    target = _numpy_q_lambda(fragment["reward"], value, next_value, terminated, done, length)
    mask = np.arange(time)[None] < length[:, None]
    x, action = observ[mask], fragment["action"][mask]
    error = q(x)[np.arange(len(x)), action] - target[mask]
    one_hot = np.eye(3, dtype=np.float32)[action]
    want_kernel = kernel - 0.1 * x.T @ (error[:, None] * one_hot) / len(x)
    want_bias = bias - 0.1 * (error[:, None] * one_hot).sum(0) / len(x)
    algo.learn(fragment)
    new_kernel, new_bias = (weight.numpy() for weight in algo.networks.policy.trainable_variables)
    np.testing.assert_allclose(new_kernel, want_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_bias, want_bias, rtol=1e-5, atol=1e-6)


def test_pqn_trains_on_a_multidiscrete_space_through_the_agent():
    """A no-crash run: the Agent's loop acts with flat MultiDiscrete actions and updates
    (twice) on them; the actions are valid indices and the Q network changes."""
    from tests.agent_fixtures import Feed, make_agent

    agent = make_agent(num_envs=2, action_space=spaces.MultiDiscrete([3, 2]), config={
        **PQN, "network": "feed_forward_composite", "policy_layers": [8],
        "rollout_length": 4, "max_length": 10, "update_epochs": 1})
    before = agent._algo.actor.get_weights()
    feed, actions = Feed(2, seed=1), []
    for _ in range(8):
        actions.append(np.asarray(agent.act(feed.observation())))
        agent.observe(*feed.step(), final_observation=feed.observation())
    after = agent._algo.actor.get_weights()
    assert any(not np.array_equal(old, new) for old, new in zip(before, after, strict=True))
    actions = np.stack(actions)
    assert actions.shape == (8, 2, 2)
    assert set(np.unique(actions[..., 0])) <= {0, 1, 2}
    assert set(np.unique(actions[..., 1])) <= {0, 1}

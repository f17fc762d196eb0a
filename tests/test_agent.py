"""`batchrl.Agent`: act / observe driven by the test's own loop, save / load, bad input."""

import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl.agent import Agent
from batchrl.configs import ConfigError

SMALL = {"policy_layers": [16], "value_layers": [16], "update_every": 4, "update_epochs": 2,
         "max_length": 10}
OBSERVATION = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTION = spaces.Box(np.array([0.0, -2.0], np.float32), np.array([1.0, 2.0], np.float32))


def _agent(num_envs=3, observation_space=OBSERVATION, action_space=ACTION, **overrides):
    return Agent.create(dict(SMALL), observation_space, action_space, num_envs=num_envs,
                        **overrides)


class _Feed:
    """Deterministic observations, rewards and episode ends of `num_envs` environments whose
    episodes last 3, 4, 5, ... steps (environment i: 3 + i), the last one truncated."""

    def __init__(self, num_envs, observ_shape=(3,), seed=0):
        self._random = np.random.default_rng(seed)
        self._shape = observ_shape
        self._steps = np.zeros(num_envs, int)
        self._durations = 3 + np.arange(num_envs)

    def observation(self):
        return self._random.normal(size=(len(self._steps),) + self._shape).astype(np.float32)

    def step(self):
        self._steps += 1
        ended = self._steps >= self._durations
        self._steps[ended] = 0
        truncated = ended & (np.arange(len(ended)) == len(ended) - 1)
        reward = self._random.normal(size=len(ended)).astype(np.float32)
        return reward, ended & ~truncated, truncated


def _play(agent, feed, steps):
    for _ in range(steps):
        agent.act(feed.observation())
        agent.observe(*feed.step(), final_observation=feed.observation())


def _variables(agent, directory):
    """Everything `save` writes to its checkpoint, by checkpoint key."""
    agent.save(directory)
    reader = tf.train.load_checkpoint(str(directory / "agent"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "OBJECT_GRAPH" not in name}


@pytest.mark.parametrize("observ_shape", [(3,), (2, 3)])
def test_learns_from_the_application_loop(observ_shape):
    observation_space = spaces.Box(-np.inf, np.inf, observ_shape, np.float32)
    agent = _agent(observation_space=observation_space)
    feed = _Feed(3, observ_shape)
    before = [v.numpy().copy() for v in agent._algo.networks.policy.trainable_variables]
    for _ in range(30):
        action = agent.act(feed.observation())
        assert action.shape == (3, 2) and action.dtype == np.float32
        assert (action >= ACTION.low).all() and (action <= ACTION.high).all()
        done = agent.observe(*feed.step())
        assert done.shape == (3,)
    assert agent.step == 90
    after = agent._algo.networks.policy.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))
    assert agent._act_sampled.experimental_get_tracing_count() == 1
    assert agent._observe.experimental_get_tracing_count() == 1


def test_records_terminated_and_truncated_episodes_as_such():
    agent = _agent(update_every=50)
    _play(agent, _Feed(3), 12)
    memory = agent._algo._memory
    count = int(agent._algo._memory_index.numpy())
    terminated = agent._algo._memory_terminated.numpy()[:count]
    _, length = memory.data()
    length = length.numpy()[:count]
    # Environment 2 (5-step episodes) is the truncated one; the others terminate.
    assert count == 4 + 3 + 2
    assert (terminated == (length != 5)).all()


def test_deterministic_act_is_repeatable_and_records_nothing(tmp_path):
    agent = _agent()
    feed = _Feed(3)
    _play(agent, feed, 5)
    saved = _variables(agent, tmp_path / "before")
    step = agent.step
    observ = feed.observation()
    first = agent.act(observ, deterministic=True)
    agent.observe(*feed.step())
    second = agent.act(observ, deterministic=True)
    np.testing.assert_array_equal(first, second)
    assert agent.step == step
    after = _variables(agent, tmp_path / "after")
    changed = [name for name in saved if not np.array_equal(saved[name], after[name])]
    assert changed == [], "a deterministic step changed " + ", ".join(changed)


@pytest.mark.parametrize("algorithm", ["ppo", "trpo"])
def test_save_and_load_continue_exactly(tmp_path, algorithm):
    """Also for TRPO: its optimizers (a line search around the natural gradient, Adam
    steps for the value) are saved and restored with the rest."""
    agent = _agent(seed=3, algorithm=algorithm)
    feed = _Feed(3, seed=1)
    _play(agent, feed, 7)
    agent.save(tmp_path / "agent")
    loaded = Agent.load(tmp_path / "agent")
    state = np.random.get_state()
    for follower in (agent, loaded):  # The same 15 steps: two updates on each.
        np.random.set_state(state)
        twin = _Feed(3, seed=2)
        actions = []
        for _ in range(15):
            actions.append(follower.act(twin.observation()))
            follower.observe(*twin.step())
        follower.actions = actions
    np.testing.assert_array_equal(np.array(agent.actions), np.array(loaded.actions))
    assert loaded.step == agent.step == 66
    original = _variables(agent, tmp_path / "original")
    restored = _variables(loaded, tmp_path / "restored")
    assert original.keys() == restored.keys()
    for name in original:
        np.testing.assert_array_equal(original[name], restored[name], err_msg=name)


def test_load_refuses_other_spaces(tmp_path):
    _agent().save(tmp_path / "agent")
    other = spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ValueError, match="observation_space .* does not match"):
        Agent.load(tmp_path / "agent", observation_space=other)
    with pytest.raises(FileNotFoundError, match="no saved agent"):
        Agent.load(tmp_path / "nothing")


def test_discrete_actions():
    agent = _agent(action_space=spaces.Discrete(3), network="feed_forward_categorical")
    feed = _Feed(3)
    for _ in range(10):
        action = agent.act(feed.observation())
        assert action.dtype == np.int32 and set(action.tolist()) <= {0, 1, 2}
        agent.observe(*feed.step())


@pytest.mark.parametrize("call, message", [
    (lambda agent: agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool)),
     r"observe\(\) without act\(\)"),
    (lambda agent: agent.act(np.zeros((2, 3))), r"observation of shape \(2, 3\), expected"),
    (lambda agent: agent.act(np.full((3, 3), np.nan)),
     r"observation is not finite for environments \[0, 1, 2\]"),
])
def test_bad_calls_name_the_culprit(call, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        call(_agent())


def test_act_twice_and_bad_observe_arguments():
    agent = _agent()
    agent.act(np.zeros((3, 3)))
    with pytest.raises(RuntimeError, match="act\\(\\) called again before observe"):
        agent.act(np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"reward is not finite for environments \[1\]"):
        agent.observe(np.array([0.0, np.inf, 0.0]), np.zeros(3, bool), np.zeros(3, bool))
    with pytest.raises(ValueError, match=r"terminated of shape \(2,\)"):
        agent.observe(np.zeros(3), np.zeros(2, bool), np.zeros(3, bool))


def test_episode_longer_than_max_length_is_a_clear_error():
    agent = _agent(max_length=3)
    for _ in range(3):
        agent.act(np.zeros((3, 3)))
        agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool))
    agent.act(np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"environments \[0, 1, 2\] passed max_length=3"):
        agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool))


def test_overrides_are_validated_like_set():
    with pytest.raises(ConfigError, match="unknown config key 'polcy_lr'"):
        _agent(polcy_lr=1e-3)
    with pytest.raises(ConfigError, match="unknown config"):
        Agent.create("no_such_config", OBSERVATION, ACTION, num_envs=2)
    with pytest.raises(ConfigError, match="'network' is 'feed_forward_categorical'.*Discrete"):
        _agent(network="feed_forward_categorical")


def test_summaries_go_to_logdir(tmp_path):
    agent = _agent(logdir=tmp_path, log_every=30)
    _play(agent, _Feed(3), 40)
    agent.close()
    tags = set()
    for event in tf.compat.v1.train.summary_iterator(
            str(next(tmp_path.glob("events.out.tfevents.*")))):
        tags.update(value.tag for value in event.summary.value)
    assert {"mean_score", "ppo/kl", "ppo/value_loss"} <= tags


_LOAD_WITHOUT_BATCHRL = """
import sys
import numpy as np
import tensorflow as tf
data = np.load(sys.argv[2])
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
inputs = {"observation": tf.constant(data["observation"])}
if "state" in data:
    inputs["state"] = tf.constant(data["state"])
result = serve(**inputs)
sampled = model.signatures["sample"](**inputs)["action"].numpy()
assert "batchrl" not in sys.modules
np.savez(sys.argv[3], action=result["action"].numpy(), sampled=sampled)
"""


@pytest.mark.parametrize("network, action_space", [
    ("feed_forward_gaussian", ACTION),
    ("feed_forward_categorical", spaces.Discrete(3)),
    ("recurrent_gaussian", ACTION),
])
def test_exported_model_acts_as_the_agent_without_batchrl(tmp_path, network, action_space):
    """Served in a process that never imports batchrl, the exported mean actions of 100
    observations equal `act(deterministic=True)` within 1e-5."""
    import subprocess
    import sys

    agent = _agent(num_envs=100, action_space=action_space, network=network)
    _play(agent, _Feed(100), 6)  # Trains once and moves the observation normalizer.
    observation = _Feed(100, seed=5).observation()
    expected = agent.act(observation, deterministic=True)
    agent.export(tmp_path / "model")
    inputs = {"observation": observation}
    if agent._algo.state_size:
        inputs["state"] = np.zeros((100, agent._algo.state_size), np.float32)
    np.savez(tmp_path / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_BATCHRL, str(tmp_path / "model"),
                    str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
                   check=True, cwd=tmp_path)
    served = np.load(tmp_path / "out.npz")
    assert served["action"].dtype == expected.dtype
    np.testing.assert_allclose(served["action"], expected, atol=1e-5)
    assert served["sampled"].shape == expected.shape
    if network != "feed_forward_categorical":
        assert not np.allclose(served["sampled"], expected), "sample draws from the policy"

"""`batchrl.Agent`: act / observe driven by the test's own loop, save / load, bad input."""


import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl.agent import Agent
from batchrl.configs import ConfigError
from tests.agent_fixtures import ACTION, OBSERVATION, SMALL, Feed, make_agent, play


def _variables(agent, directory):
    """Everything `save` writes to its checkpoint, by checkpoint key."""
    agent.save(directory)
    reader = tf.train.load_checkpoint(str(directory / "agent"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "OBJECT_GRAPH" not in name}


@pytest.mark.parametrize("observ_shape", [(3,), (2, 3)])
def test_learns_from_the_application_loop(observ_shape):
    observation_space = spaces.Box(-np.inf, np.inf, observ_shape, np.float32)
    agent = make_agent(observation_space=observation_space)
    feed = Feed(3, observ_shape)
    before = [v.numpy().copy() for v in agent._algo.networks.policy.trainable_variables]
    for _ in range(30):
        action = agent.act(feed.observation())
        assert action.shape == (3, 2) and action.dtype == np.float32
        assert (action >= ACTION.low).all() and (action <= ACTION.high).all()
        done = agent.observe(*feed.step(), final_observation=feed.observation())
        assert done.shape == (3,)
    assert agent.step == 90
    after = agent._algo.networks.policy.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))
    assert agent._act_sampled.experimental_get_tracing_count() == 1
    assert agent._observe.experimental_get_tracing_count() == 1


def test_records_terminated_and_truncated_episodes_as_such():
    agent = make_agent(update_every=50)
    play(agent, Feed(3), 12)
    memory = agent._algo._memory
    count = int(agent._algo._memory_index.numpy())
    terminated = agent._algo._memory_terminated.numpy()[:count]
    _, length = memory.data()
    length = length.numpy()[:count]
    # Environment 2 (5-step episodes) is the truncated one; the others terminate.
    assert count == 4 + 3 + 2
    assert (terminated == (length != 5)).all()


def test_deterministic_act_is_repeatable_and_records_nothing(tmp_path):
    agent = make_agent()
    feed = Feed(3)
    play(agent, feed, 5)
    agent.reset()  # Ends the training episodes in progress (as the first deterministic act).
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
    config = {key: value for key, value in SMALL.items()
              if algorithm == "ppo" or key != "update_epochs"}  # A key of PPO only.
    agent = make_agent(seed=3, algorithm=algorithm, config=config)
    feed = Feed(3, seed=1)
    play(agent, feed, 7)
    agent.save(tmp_path / "agent")
    loaded = Agent.load(tmp_path / "agent")
    state = np.random.get_state()
    for follower in (agent, loaded):  # The same 15 steps: two updates on each.
        np.random.set_state(state)
        twin = Feed(3, seed=2)
        actions = []
        for _ in range(15):
            actions.append(follower.act(twin.observation()))
            follower.observe(*twin.step(), final_observation=twin.observation())
        follower.actions = actions
    np.testing.assert_array_equal(np.array(agent.actions), np.array(loaded.actions))
    assert loaded.step == agent.step == 66
    original = _variables(agent, tmp_path / "original")
    restored = _variables(loaded, tmp_path / "restored")
    assert original.keys() == restored.keys()
    for name in original:
        np.testing.assert_array_equal(original[name], restored[name], err_msg=name)


def test_load_refuses_other_spaces(tmp_path):
    make_agent().save(tmp_path / "agent")
    other = spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ValueError, match="observation_space .* does not match"):
        Agent.load(tmp_path / "agent", observation_space=other)
    with pytest.raises(FileNotFoundError, match="no saved agent"):
        Agent.load(tmp_path / "nothing")


def test_discrete_actions():
    agent = make_agent(action_space=spaces.Discrete(3), network="feed_forward_categorical")
    feed = Feed(3)
    for _ in range(10):
        action = agent.act(feed.observation())
        assert action.dtype == np.int32 and set(action.tolist()) <= {0, 1, 2}
        agent.observe(*feed.step(), final_observation=feed.observation())


@pytest.mark.parametrize("call, message", [
    (lambda agent: agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool)),
     r"observe\(\) without act\(\)"),
    (lambda agent: agent.act(np.zeros((2, 3))), r"observation of shape \(2, 3\), expected"),
    (lambda agent: agent.act(np.full((3, 3), np.nan)),
     r"observation is not finite for environments \[0, 1, 2\]"),
])
def test_bad_calls_name_the_culprit(call, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        call(make_agent())


def test_act_twice_and_bad_observe_arguments():
    agent = make_agent()
    agent.act(np.zeros((3, 3)))
    with pytest.raises(RuntimeError, match="act\\(\\) called again before observe"):
        agent.act(np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"reward is not finite for environments \[1\]"):
        agent.observe(np.array([0.0, np.inf, 0.0]), np.zeros(3, bool), np.zeros(3, bool))
    with pytest.raises(ValueError, match=r"terminated of shape \(2,\)"):
        agent.observe(np.zeros(3), np.zeros(2, bool), np.zeros(3, bool))
    with pytest.raises(ValueError, match=r"after a sampled act\(\) needs final_observation"):
        agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool))
    assert agent.step == 0  # Nothing was recorded: the call may be repeated.
    agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool),
                  final_observation=np.zeros((3, 3)))
    assert agent.step == 3


def test_episode_longer_than_max_length_is_a_clear_error():
    agent = make_agent(max_length=3)
    for _ in range(3):
        agent.act(np.zeros((3, 3)))
        agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool),
                      final_observation=np.zeros((3, 3)))
    agent.act(np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"environments \[0, 1, 2\] passed max_length=3"):
        agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool),
                      final_observation=np.zeros((3, 3)))


def test_overrides_are_validated_like_set():
    with pytest.raises(ConfigError, match="unknown config key 'polcy_lr'"):
        make_agent(polcy_lr=1e-3)
    with pytest.raises(ConfigError, match="unknown config"):
        Agent.create("no_such_config", OBSERVATION, ACTION, num_envs=2)
    with pytest.raises(ConfigError, match="'network' is 'feed_forward_categorical'.*Discrete"):
        make_agent(network="feed_forward_categorical")


def test_summaries_go_to_logdir(tmp_path):
    agent = make_agent(logdir=tmp_path, log_every=30)
    play(agent, Feed(3), 40)
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
inputs = {key: tf.constant(data[key]) for key in data.files}
result = serve(**inputs)
sampled = model.signatures["sample"](**inputs)
leaves = {key[len("observation_"):]: value for key, value in inputs.items()
          if key.startswith("observation_")}
if leaves:  # The same function takes the nested observation itself.
    again = model.deterministic(leaves)
    assert all(np.array_equal(again[key], result[key]) for key in result)
assert "batchrl" not in sys.modules
np.savez(sys.argv[3], **{key: value.numpy() for key, value in result.items()},
         **{"sampled_" + key: value.numpy() for key, value in sampled.items()})
"""

NESTED_OBSERVATION = spaces.Dict({
    "angle": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "cue": spaces.Discrete(3, start=1),
    "velocity": spaces.Box(-8.0, 8.0, (1,), np.float32)})
NESTED_ACTION = spaces.Dict({
    "kind": spaces.Discrete(3, start=1),
    "more": spaces.Tuple((spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(2))),
    "move": spaces.Box(-2.0, 2.0, (2,), np.float32)})


def _nested_observation(num_envs, random):
    return {"angle": random.uniform(-1, 1, (num_envs, 2)),
            "cue": random.integers(1, 4, num_envs),
            "velocity": random.uniform(-8, 8, (num_envs, 1))}


def _rows(action, num_envs):
    """The action of each environment, from the nested batch `act` returns."""
    return [tf.nest.map_structure(lambda leaf, row=row: leaf[row], action)
            for row in range(num_envs)]


@pytest.mark.parametrize("network, observation_space, action_space", [
    ("feed_forward_gaussian", OBSERVATION, ACTION),
    ("feed_forward_categorical", OBSERVATION, spaces.Discrete(3)),
    ("recurrent_gaussian", OBSERVATION, ACTION),
    ("feed_forward_composite", NESTED_OBSERVATION, NESTED_ACTION),
])
def test_exported_model_acts_as_the_agent_without_batchrl(tmp_path, network, observation_space,
                                                          action_space):
    """Served in a process that never imports batchrl, the exported mean actions of 100
    observations equal `act(deterministic=True)` within 1e-5."""
    import subprocess
    import sys

    agent = make_agent(num_envs=100, observation_space=observation_space,
                   action_space=action_space, network=network)
    if observation_space is OBSERVATION:
        play(agent, Feed(100), 6)  # Trains once and moves the observation normalizer.
        observation = Feed(100, seed=5).observation()
        inputs = {"observation": observation}
    else:
        random = np.random.default_rng(0)
        for _ in range(6):
            agent.act(_nested_observation(100, random))
            agent.observe(*Feed(100).step(),
                          final_observation=_nested_observation(100, random))
        observation = _nested_observation(100, random)
        inputs = {"observation_" + key: value for key, value in observation.items()}
        inputs["observation_cue"] = inputs["observation_cue"].astype(np.int64)
    expected = agent.act(observation, deterministic=True)
    agent.export(tmp_path / "model")
    if agent._algo.state_size:
        inputs["state"] = np.zeros((100, agent._algo.state_size), np.float32)
    inputs = {key: np.asarray(value, np.float32) if value.dtype == np.float64 else value
              for key, value in inputs.items()}
    np.savez(tmp_path / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_BATCHRL, str(tmp_path / "model"),
                    str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
                   check=True, cwd=tmp_path)
    served = dict(np.load(tmp_path / "out.npz"))
    if isinstance(expected, dict):
        expected = {"action_kind": expected["kind"], "action_more_0": expected["more"][0],
                    "action_more_1": expected["more"][1], "action_move": expected["move"]}
    else:
        expected = {"action": expected}
    for key, value in expected.items():
        assert served[key].dtype == value.dtype, key
        np.testing.assert_allclose(served[key], value, atol=1e-5, err_msg=key)
        assert served["sampled_" + key].shape == value.shape
    if network != "feed_forward_categorical":
        assert not np.allclose(served["sampled_action" if "action" in served else
                                      "sampled_action_move"],
                               served["action" if "action" in served else "action_move"]), \
            "sample draws from the policy"


def test_nested_spaces_act_learn_and_continue_after_load(tmp_path):
    agent = make_agent(observation_space=NESTED_OBSERVATION, action_space=NESTED_ACTION,
                   network="feed_forward_composite")
    random = np.random.default_rng(0)
    feed = Feed(3)
    before = [v.numpy().copy() for v in agent._algo.networks.policy.trainable_variables]
    for _ in range(30):
        action = agent.act(_nested_observation(3, random))
        assert action["kind"].dtype == np.int32 and action["move"].dtype == np.float32
        assert action["more"][0].dtype == np.int32 and action["more"][1].dtype == np.int8
        assert all(NESTED_ACTION.contains(row) for row in _rows(action, 3)), action
        agent.observe(*feed.step(), final_observation=_nested_observation(3, random))
    after = agent._algo.networks.policy.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))
    assert agent._act_sampled.experimental_get_tracing_count() == 1
    # Observations are flattened as Gymnasium does: angle (2), cue one-hot (3), velocity (1).
    # The normalizer has moved, but leaves the one-hot elements as they are.
    flat = np.array([[0.5, -0.5, 0.0, 1.0, 0.0, 3.0]], np.float32)
    normalized = agent._algo._observ_filter.transform(flat).numpy()
    np.testing.assert_array_equal(normalized[0, 2:5], [0.0, 1.0, 0.0])
    assert not np.allclose(normalized[0, [0, 1, 5]], flat[0, [0, 1, 5]])
    observation = _nested_observation(3, random)
    expected = agent.act(observation, deterministic=True)
    agent.observe(*feed.step())
    agent.save(tmp_path / "agent")
    loaded = Agent.load(tmp_path / "agent", NESTED_OBSERVATION, NESTED_ACTION)
    again = loaded.act(observation, deterministic=True)
    for ours, theirs in zip(tf.nest.flatten(expected), tf.nest.flatten(again), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_wrong_nested_observations_and_spaces_name_the_leaf():
    agent = make_agent(observation_space=NESTED_OBSERVATION, action_space=NESTED_ACTION,
                   network="feed_forward_composite")
    random = np.random.default_rng(0)
    observation = _nested_observation(3, random)
    with pytest.raises(ValueError, match=r"observation\['angle'\] of shape \(3, 3\), "
                                         r"expected \(3, 2\)"):
        agent.act(dict(observation, angle=np.zeros((3, 3))))
    with pytest.raises(ValueError, match=r"observation\['cue'\] holds values outside "
                                         r"Discrete\(3, start=1\) for environments \[2\]"):
        agent.act(dict(observation, cue=np.array([1, 3, 0])))
    with pytest.raises(ValueError, match=r"observation\['velocity'\] is missing"):
        agent.act({"angle": observation["angle"], "cue": observation["cue"]})
    agent.act(observation)
    with pytest.raises(ValueError, match=r"final_observation\['velocity'\] is not finite for "
                                         r"environments \[1\]"):
        agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool),
                      final_observation=dict(observation, velocity=np.array([[0], [np.nan], [0]])))
    with pytest.raises(ConfigError, match=r"action\['more'\]\[1\] is Text"):
        make_agent(action_space=spaces.Dict({"more": spaces.Tuple((spaces.Discrete(2),
                                                                 spaces.Text(3)))}),
               network="feed_forward_composite")
    with pytest.raises(ConfigError, match=r"'network' is 'feed_forward_gaussian'.*Box .*Dict.*"
                                          r"use feed_forward_composite"):
        make_agent(observation_space=NESTED_OBSERVATION, action_space=NESTED_ACTION)


def test_discrete_observations_are_one_hot():
    agent = make_agent(observation_space=spaces.Discrete(5), action_space=spaces.Discrete(2),
                   network="feed_forward_categorical")
    feed = Feed(3)
    for step in range(10):
        action = agent.act(np.array([0, 4, step % 5]))
        assert set(action.tolist()) <= {0, 1}
        agent.observe(*feed.step(), final_observation=np.array([1, 4, (step + 1) % 5]))
    np.testing.assert_array_equal(agent._batch_env.observ.numpy()[:2],
                                  [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    with pytest.raises(ValueError, match=r"observation holds values outside Discrete\(5\) for "
                                         r"environments \[1\]"):
        agent.act(np.array([0, 5, 1]))


# Episodes: resets, deterministic steps amid training, the episode limit (issue 31).

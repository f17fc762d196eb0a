"""`batchrl.Agent`: act / observe driven by the test's own loop, save / load, bad input.

Each agent costs seconds of tracing, so the tests share a few: a module fixture runs one
agent's whole story and records what the tests then check, in any order. The policies of
Box observations exported and served without batchrl are checked in
tests/test_export_conversion.py (`test_converted_mean_actions_equal_the_agents[savedmodel]`).
"""


import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl.agent import Agent
from batchrl.configs import ConfigError
from tests.agent_fixtures import ACTION, OBSERVATION, SMALL, Feed, make_agent, play

SHAPED = spaces.Box(-np.inf, np.inf, (2, 3), np.float32)  # Flattened for the networks.


def _variables(agent, directory):
    """Everything `save` writes to its checkpoint, by checkpoint key."""
    agent.save(directory)
    reader = tf.train.load_checkpoint(str(directory / "agent"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "OBJECT_GRAPH" not in name}


def _policy_weights(agent):
    return [v.numpy().copy() for v in agent._algo.networks.policy.trainable_variables]


def _save_load_and_continue(agent, directory, observ_shape, logdir=None):
    """Saves `agent`, loads it, and plays the same 15 steps (two updates or more) on both:
    their actions, their steps after, and their checkpoint variables after."""
    agent.save(directory / "agent")
    loaded = Agent.load(directory / "agent", logdir=logdir)
    state = np.random.get_state()
    played = []
    for follower in (agent, loaded):
        np.random.set_state(state)
        twin = Feed(3, observ_shape, seed=2)
        actions = []
        for _ in range(15):
            actions.append(follower.act(twin.observation()))
            follower.observe(*twin.step(), final_observation=twin.observation())
        played.append(np.array(actions))
    return {"actions": played, "steps": (agent.step, loaded.step),
            "variables": (_variables(agent, directory / "original"),
                          _variables(loaded, directory / "restored"))}


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A PPO agent on observations of shape (2, 3), logging every 30 steps: 30 steps of the
    application's loop (an update every 4 episodes), then saved, loaded (logging too) and
    both played on for the same 15 steps, then deterministic steps after a reset."""
    directory = tmp_path_factory.mktemp("ppo")
    agent = make_agent(observation_space=SHAPED, seed=3, logdir=directory / "logs",
                       log_every=30)
    feed = Feed(3, SHAPED.shape)
    run = {"before": _policy_weights(agent), "actions": [], "done": []}
    for _ in range(30):
        run["actions"].append(agent.act(feed.observation()))
        run["done"].append(agent.observe(*feed.step(), final_observation=feed.observation()))
    run["step"] = agent.step
    run["after"] = _policy_weights(agent)
    run["tracing"] = (agent._act_sampled.experimental_get_tracing_count(),
                      agent._observe.experimental_get_tracing_count())
    run["continued"] = _save_load_and_continue(agent, directory, SHAPED.shape,
                                               logdir=directory / "loaded_logs")
    agent.reset()  # Ends the training episodes in progress (as the first deterministic act).
    run["saved"] = _variables(agent, directory / "before_deterministic")
    run["step_before_deterministic"] = agent.step
    observ = feed.observation()
    run["deterministic"] = [agent.act(observ, deterministic=True)]
    agent.observe(*feed.step())
    run["deterministic"].append(agent.act(observ, deterministic=True))
    run["step_after_deterministic"] = agent.step
    run["after_deterministic"] = _variables(agent, directory / "after_deterministic")
    agent.close()
    run["logdir"] = directory / "logs"
    return run


def test_learns_from_the_application_loop(ppo_run):
    for action, done in zip(ppo_run["actions"], ppo_run["done"], strict=True):
        assert action.shape == (3, 2) and action.dtype == np.float32
        assert (action >= ACTION.low).all() and (action <= ACTION.high).all()
        assert done.shape == (3,)
    assert any(done.any() for done in ppo_run["done"])
    assert ppo_run["step"] == 90
    assert any(not np.allclose(a, b)
               for a, b in zip(ppo_run["before"], ppo_run["after"], strict=True))
    assert ppo_run["tracing"] == (1, 1)


def test_summaries_go_to_logdir(ppo_run):
    tags = set()
    for event in tf.compat.v1.train.summary_iterator(
            str(next(ppo_run["logdir"].glob("events.out.tfevents.*")))):
        tags.update(value.tag for value in event.summary.value)
    assert {"mean_score", "ppo/kl", "ppo/value_loss"} <= tags


def test_deterministic_act_is_repeatable_and_records_nothing(ppo_run):
    first, second = ppo_run["deterministic"]
    np.testing.assert_array_equal(first, second)
    assert ppo_run["step_after_deterministic"] == ppo_run["step_before_deterministic"]
    saved, after = ppo_run["saved"], ppo_run["after_deterministic"]
    changed = [name for name in saved if not np.array_equal(saved[name], after[name])]
    assert changed == [], "a deterministic step changed " + ", ".join(changed)


@pytest.mark.parametrize("algorithm", ["ppo", "trpo"])
def test_save_and_load_continue_exactly(tmp_path, algorithm, request):
    """Also for TRPO: its optimizers (a line search around the natural gradient, Adam
    steps for the value) are saved and restored with the rest. PPO's agent is
    `ppo_run`'s, saved after 30 steps."""
    if algorithm == "ppo":
        continued, steps = request.getfixturevalue("ppo_run")["continued"], 90 + 45
    else:
        config = {key: value for key, value in SMALL.items()
                  if key != "update_epochs"}  # A key of PPO only.
        agent = make_agent(seed=3, algorithm=algorithm, config=config)
        play(agent, Feed(3, seed=1), 7)  # One update before the save.
        continued, steps = _save_load_and_continue(agent, tmp_path, (3,)), 21 + 45
    np.testing.assert_array_equal(*continued["actions"])
    assert continued["steps"] == (steps, steps)
    original, restored = continued["variables"]
    assert original.keys() == restored.keys()
    for name in original:
        np.testing.assert_array_equal(original[name], restored[name], err_msg=name)


@pytest.fixture(scope="module")
def discrete_run():
    """An agent of Discrete(5) observations and Discrete(3) actions that does not update
    (update_every 50): 12 steps of 3 environments whose episodes last 3, 4 and 5 steps, the
    5-step ones truncated."""
    agent = make_agent(observation_space=spaces.Discrete(5), action_space=spaces.Discrete(3),
                       network="feed_forward_categorical", update_every=50)
    feed = Feed(3)
    run = {"actions": []}
    for step in range(12):
        run["actions"].append(agent.act(np.array([0, 4, step % 5])))
        agent.observe(*feed.step(), final_observation=np.array([1, 4, (step + 1) % 5]))
    run["observ"] = agent._batch_env.observ.numpy()
    count = int(agent._algo._memory_index.numpy())
    _, length = agent._algo._memory.data()
    run["terminated"] = agent._algo._memory_terminated.numpy()[:count]
    run["length"] = length.numpy()[:count]
    run["agent"] = agent  # For calls that it refuses.
    return run


def test_records_terminated_and_truncated_episodes_as_such(discrete_run):
    # Environment 2 (5-step episodes) is the truncated one; the others terminate.
    assert len(discrete_run["length"]) == 4 + 3 + 2
    assert (discrete_run["terminated"] == (discrete_run["length"] != 5)).all()


def test_discrete_actions(discrete_run):
    for action in discrete_run["actions"]:
        assert action.dtype == np.int32 and set(action.tolist()) <= {0, 1, 2}


def test_discrete_observations_are_one_hot(discrete_run):
    # The observations after the last step: 1 and 4 in environments 0 and 1.
    np.testing.assert_array_equal(discrete_run["observ"][:2],
                                  [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    with pytest.raises(ValueError, match=r"observation holds values outside Discrete\(5\) "
                                         r"for environments \[1\]"):
        discrete_run["agent"].act(np.array([0, 5, 1]))


@pytest.fixture(scope="module")
def untouched():
    """A new agent that the tests using it do not change (their calls are refused)."""
    return make_agent()


def test_load_refuses_other_spaces(untouched, tmp_path):
    untouched.save(tmp_path / "agent")
    other = spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ValueError, match="observation_space .* does not match"):
        Agent.load(tmp_path / "agent", observation_space=other)
    with pytest.raises(FileNotFoundError, match="no saved agent"):
        Agent.load(tmp_path / "nothing")


@pytest.mark.parametrize("call, message", [
    (lambda agent: agent.observe(np.zeros(3), np.zeros(3, bool), np.zeros(3, bool)),
     r"observe\(\) without act\(\)"),
    (lambda agent: agent.act(np.zeros((2, 3))), r"observation of shape \(2, 3\), expected"),
    (lambda agent: agent.act(np.full((3, 3), np.nan)),
     r"observation is not finite for environments \[0, 1, 2\]"),
])
def test_bad_calls_name_the_culprit(untouched, call, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        call(untouched)


def test_act_twice_bad_observe_arguments_and_the_episode_limit():
    agent = make_agent(max_length=3)
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
    for _ in range(2):  # Episodes of 3 steps, max_length's.
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
leaves = {key[len("observation_"):]: value for key, value in inputs.items()}
again = model.deterministic(leaves)  # The same function takes the nested observation itself.
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


@pytest.fixture(scope="module")
def nested_run(tmp_path_factory):
    """An agent of nested spaces through 30 steps (updates every 4 episodes), then its mean
    actions for one observation: its own, after `save` / `load`, and of its exported
    SavedModel served in a process that never imports batchrl."""
    import subprocess
    import sys

    directory = tmp_path_factory.mktemp("nested")
    agent = make_agent(observation_space=NESTED_OBSERVATION, action_space=NESTED_ACTION,
                       network="feed_forward_composite")
    random = np.random.default_rng(0)
    feed = Feed(3)
    run = {"before": _policy_weights(agent), "actions": []}
    for _ in range(30):
        run["actions"].append(agent.act(_nested_observation(3, random)))
        agent.observe(*feed.step(), final_observation=_nested_observation(3, random))
    run["after"] = _policy_weights(agent)
    run["tracing"] = agent._act_sampled.experimental_get_tracing_count()
    # Observations are flattened as Gymnasium does: angle (2), cue one-hot (3), velocity (1).
    run["flat"] = np.array([[0.5, -0.5, 0.0, 1.0, 0.0, 3.0]], np.float32)
    run["normalized"] = agent._algo._observ_filter.transform(run["flat"]).numpy()
    observation = _nested_observation(3, random)
    run["expected"] = agent.act(observation, deterministic=True)
    agent.observe(*feed.step())
    agent.save(directory / "agent")
    loaded = Agent.load(directory / "agent", NESTED_OBSERVATION, NESTED_ACTION)
    run["loaded"] = loaded.act(observation, deterministic=True)
    agent.export(directory / "model")
    inputs = {"observation_" + key: value for key, value in observation.items()}
    inputs = {key: value.astype(np.int64 if key == "observation_cue" else np.float32)
              for key, value in inputs.items()}
    np.savez(directory / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_BATCHRL, str(directory / "model"),
                    str(directory / "inputs.npz"), str(directory / "out.npz")],
                   check=True, cwd=directory)
    run["served"] = dict(np.load(directory / "out.npz"))
    return run


def test_nested_spaces_act_learn_and_continue_after_load(nested_run):
    for action in nested_run["actions"]:
        assert action["kind"].dtype == np.int32 and action["move"].dtype == np.float32
        assert action["more"][0].dtype == np.int32 and action["more"][1].dtype == np.int8
        assert all(NESTED_ACTION.contains(row) for row in _rows(action, 3)), action
    assert any(not np.allclose(a, b)
               for a, b in zip(nested_run["before"], nested_run["after"], strict=True))
    assert nested_run["tracing"] == 1
    # The normalizer has moved, but leaves the one-hot elements as they are.
    flat, normalized = nested_run["flat"], nested_run["normalized"]
    np.testing.assert_array_equal(normalized[0, 2:5], [0.0, 1.0, 0.0])
    assert not np.allclose(normalized[0, [0, 1, 5]], flat[0, [0, 1, 5]])
    for ours, theirs in zip(tf.nest.flatten(nested_run["expected"]),
                            tf.nest.flatten(nested_run["loaded"]), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_exported_model_acts_as_the_agent_without_batchrl(nested_run):
    """Served in a process that never imports batchrl, the exported mean actions (an output
    per action leaf) equal `act(deterministic=True)` within 1e-5; `sample` draws from the
    policy."""
    served, expected = nested_run["served"], nested_run["expected"]
    expected = {"action_kind": expected["kind"], "action_more_0": expected["more"][0],
                "action_more_1": expected["more"][1], "action_move": expected["move"]}
    for key, value in expected.items():
        assert served[key].dtype == value.dtype, key
        np.testing.assert_allclose(served[key], value, atol=1e-5, err_msg=key)
        assert served["sampled_" + key].shape == value.shape
    assert not np.allclose(served["sampled_action_move"], served["action_move"]), \
        "sample draws from the policy"


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


# Episodes: resets, deterministic steps amid training, the episode limit (issue 31).

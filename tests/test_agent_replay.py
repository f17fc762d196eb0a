"""`batchrl.Agent` with the off-policy algorithms: `update(batch)` stores external
transitions as given and runs the updates they are owed, bad batches are refused without
storing anything, `observe` stores the next observations given (and refuses a step
without them), and `save` / `load` keep the memory.

Each agent costs seconds of tracing: module fixtures run the stories of two SAC agents (one
fed by `update`, one by `act` / `observe`), and the tests check what they recorded."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import batchrl

SMALL = {"policy_layers": [16], "value_layers": [16], "batch_size": 8, "max_length": 200,
         "replay_capacity": 100, "learning_starts": 20, "updates_per_step": 0.5}
SPACE = gym.spaces.Box(np.array([-1.0, -1.0, -8.0], np.float32),
                       np.array([1.0, 1.0, 8.0], np.float32))
ACTIONS = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
MEMORY = "replay/storage/observ/.ATTRIBUTES/VARIABLE_VALUE"


def _agent(**overrides):
    return batchrl.Agent.create("pendulum_sac", SPACE, ACTIONS, num_envs=2,
                                **{**SMALL, **overrides})


def _batch(count, seed=0):
    rng = np.random.default_rng(seed)
    return {"observation": rng.uniform(-1, 1, (count, 3)).astype(np.float32),
            "action": rng.uniform(-2, 2, (count, 1)).astype(np.float32),
            "reward": rng.normal(size=count).astype(np.float32),
            "terminated": rng.random(count) < 0.3,
            "next_observation": rng.uniform(-1, 1, (count, 3)).astype(np.float32)}


def _saved_and_loaded(agent, directory):
    """`agent` saved to `directory`: the names of the checkpoint's copies of the memory's
    observations, and the agent loaded from it."""
    agent.save(directory)
    names = [name for name, _ in tf.train.list_variables(str(directory / "agent"))]
    return [name for name in names if name.endswith(MEMORY)], batchrl.Agent.load(directory)


@pytest.fixture(scope="module")
def updated(tmp_path_factory):
    """A SAC agent (`save_replay: true`) given 30, 3 and 1 transitions by `update`, then
    saved and loaded."""
    agent = _agent(save_replay=True)
    batch = _batch(30)
    run = {"agent": agent, "batch": batch, "updates": [agent.update(batch)]}
    run["size"] = int(agent._algo.memory.size.numpy())
    run["updates"] += [agent.update(_batch(3, seed=1)), agent.update(_batch(1, seed=2))]
    run["names"], run["loaded"] = _saved_and_loaded(agent, tmp_path_factory.mktemp("updated"))
    return run


def test_update_stores_the_transitions_and_runs_the_updates_owed(updated):
    batch = updated["batch"]
    # 30 stored >= learning_starts: 0.5 per transition; then 1.5 owed: one now, the half
    # carried; then 1.
    assert updated["updates"] == [15, 16, 17]
    storage = updated["agent"]._algo.memory.storage
    np.testing.assert_allclose(storage["observ"][:30].numpy(), batch["observation"])
    np.testing.assert_allclose(storage["nextob"][:30].numpy(), batch["next_observation"])
    np.testing.assert_allclose(storage["action"][:30].numpy(), batch["action"] / 2.0,
                               rtol=1e-6)  # [-2, 2] onto the policy's [-1, 1].
    np.testing.assert_allclose(storage["reward"][:30].numpy(), batch["reward"])
    np.testing.assert_allclose(storage["discount"][:30].numpy(),
                               0.99 * (1.0 - batch["terminated"]), rtol=1e-6)
    assert updated["size"] == 30


@pytest.fixture(scope="module")
def refusing():
    """A new SAC agent that the tests using it do not change (their batches are refused)."""
    return _agent()


@pytest.mark.parametrize("change, error, message", [
    (lambda b: b.pop("terminated"), ValueError, "missing \\['terminated'\\]"),
    (lambda b: b.update(extra=1), ValueError, "unknown \\['extra'\\]"),
    (lambda b: b.update(action=b["action"] * 3), ValueError, "outside the bounds"),
    (lambda b: b["reward"].__setitem__(0, np.nan), ValueError, "reward must be finite"),
    (lambda b: b.update(observation=b["observation"][:, :2]), ValueError, "observation of "
                                                                         "shape"),
])
def test_bad_batches_are_refused_and_store_nothing(refusing, change, error, message):
    batch = _batch(5)
    change(batch)
    with pytest.raises(error, match=message):
        refusing.update(batch)
    assert int(refusing._algo.memory.size.numpy()) == 0


def test_update_needs_a_replay_memory():
    agent = batchrl.Agent.create("pendulum", SPACE, ACTIONS, num_envs=2, max_length=200)
    with pytest.raises(TypeError, match="needs an algorithm with a replay memory"):
        agent.update(_batch(5))


OBSERVATION = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], np.float32)
FINAL = np.array([[-0.1, -0.2, -0.3], [-0.4, -0.5, -0.6]], np.float32)


def _first_step(agent):
    """A first step whose `observe` comes without, then with, its final observation: the
    error, the agent's step and stored transitions after each, and the memory's first two
    rows."""
    memory = agent._algo.memory
    agent.act(OBSERVATION)
    with pytest.raises(ValueError) as error:
        agent.observe([1.0, 2.0], [False, True], [True, False])
    refused = (agent.step, int(memory.size.numpy()))
    agent.observe([1.0, 2.0], [False, True], [True, False], final_observation=FINAL)
    return {"error": str(error.value), "refused": refused,
            "recorded": (agent.step, int(memory.size.numpy())),
            "rows": {key: memory.storage[key][:2].numpy()
                     for key in ("observ", "nextob", "discount")}}


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """A SAC agent (`save_replay: false`) through `_first_step` and 14 more steps with
    random observations and final observations, then saved and loaded."""
    agent = _agent()
    rng = np.random.default_rng(3)
    run = {"agent": agent, "first": _first_step(agent)}
    observations, finals = [OBSERVATION], [FINAL]
    for _ in range(14):
        observations.append(rng.uniform(-1, 1, (2, 3)).astype(np.float32))
        finals.append(rng.uniform(-1, 1, (2, 3)).astype(np.float32))
        agent.act(observations[-1])
        agent.observe(rng.normal(size=2), [False, False], [False, False],
                      final_observation=finals[-1])
    run["observations"], run["finals"] = np.concatenate(observations), np.concatenate(finals)
    run["names"], run["loaded"] = _saved_and_loaded(agent, tmp_path_factory.mktemp("stepped"))
    return run


def test_observe_stores_the_final_observations_given_and_save_load_keeps_them(stepped):
    """Each stored transition's next observation is the `final_observation` of its step,
    not the observation its action was taken in (one-step returns: row 2 t + i is step t
    of environment i)."""
    memory = stepped["agent"]._algo.memory
    assert int(memory.size.numpy()) == 30 and int(stepped["agent"]._algo.updates.numpy()) == 6
    np.testing.assert_array_equal(memory.storage["observ"][:30].numpy(), stepped["observations"])
    np.testing.assert_array_equal(memory.storage["nextob"][:30].numpy(), stepped["finals"])
    loaded = stepped["loaded"]
    for key, variable in memory.storage.items():
        np.testing.assert_array_equal(loaded._algo.memory.storage[key].numpy(),
                                      variable.numpy(), err_msg=key)
    assert int(loaded._algo.updates.numpy()) == 6


@pytest.mark.parametrize("config", ["pendulum_sac", "cartpole_dqn"])
def test_observe_without_final_observation_is_refused_and_records_nothing(config, request):
    """After a sampled act, `observe` needs the observation after the step: without it a
    transition would bootstrap from the observation its action was taken in. SAC's agent is
    `stepped`'s."""
    if config == "pendulum_sac":
        first = request.getfixturevalue("stepped")["first"]
    else:
        agent = batchrl.Agent.create(config, SPACE, gym.spaces.Discrete(2), num_envs=2,
                                     **SMALL)
        first = _first_step(agent)
    assert "needs final_observation, the observation after the step" in first["error"]
    assert first["refused"] == (0, 0) and first["recorded"] == (2, 2)
    np.testing.assert_array_equal(first["rows"]["observ"], OBSERVATION)
    np.testing.assert_array_equal(first["rows"]["nextob"], FINAL)
    np.testing.assert_allclose(first["rows"]["discount"], [0.99, 0.0])


@pytest.mark.parametrize("save_replay", [False, True])
def test_save_writes_the_memory_once_whatever_save_replay(save_replay, request):
    """`save_replay` is the train command's: an Agent's one checkpoint holds its memory
    once either way, and `load` gets it back (`stepped`'s agent has it false, `updated`'s
    true)."""
    run = request.getfixturevalue("updated" if save_replay else "stepped")
    assert run["agent"].config.save_replay is save_replay
    assert run["names"] == ["progress/" + MEMORY]
    memory, loaded = run["agent"]._algo.memory, run["loaded"]._algo.memory
    assert int(loaded.size.numpy()) == int(memory.size.numpy()) > 0
    for key, variable in memory.storage.items():
        np.testing.assert_array_equal(loaded.storage[key].numpy(), variable.numpy(),
                                      err_msg=key)

"""`batchrl.Agent` with the off-policy algorithms: `update(batch)` stores external
transitions as given and runs the updates they are owed, bad batches are refused without
storing anything, `observe` stores the next observations given (and refuses a step
without them), and `save` / `load` keep the memory."""

import gymnasium as gym
import numpy as np
import pytest

import batchrl

SMALL = {"policy_layers": [16], "value_layers": [16], "batch_size": 8, "max_length": 200,
         "replay_capacity": 100, "learning_starts": 20, "updates_per_step": 0.5}
SPACE = gym.spaces.Box(np.array([-1.0, -1.0, -8.0], np.float32),
                       np.array([1.0, 1.0, 8.0], np.float32))
ACTIONS = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


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


def test_update_stores_the_transitions_and_runs_the_updates_owed():
    agent = _agent()
    batch = _batch(30)
    assert agent.update(batch) == 15  # 30 stored >= learning_starts: 0.5 per transition.
    storage = agent._algo.memory.storage
    np.testing.assert_allclose(storage["observ"][:30].numpy(), batch["observation"])
    np.testing.assert_allclose(storage["nextob"][:30].numpy(), batch["next_observation"])
    np.testing.assert_allclose(storage["action"][:30].numpy(), batch["action"] / 2.0,
                               rtol=1e-6)  # [-2, 2] onto the policy's [-1, 1].
    np.testing.assert_allclose(storage["reward"][:30].numpy(), batch["reward"])
    np.testing.assert_allclose(storage["discount"][:30].numpy(),
                               0.99 * (1.0 - batch["terminated"]), rtol=1e-6)
    assert int(agent._algo.memory.size.numpy()) == 30
    assert agent.update(_batch(3, seed=1)) == 16  # 1.5 owed: one now, the half carried.
    assert agent.update(_batch(1, seed=2)) == 17


@pytest.mark.parametrize("change, error, message", [
    (lambda b: b.pop("terminated"), ValueError, "missing \\['terminated'\\]"),
    (lambda b: b.update(extra=1), ValueError, "unknown \\['extra'\\]"),
    (lambda b: b.update(action=b["action"] * 3), ValueError, "outside the bounds"),
    (lambda b: b["reward"].__setitem__(0, np.nan), ValueError, "reward must be finite"),
    (lambda b: b.update(observation=b["observation"][:, :2]), ValueError, "observation of "
                                                                         "shape"),
])
def test_bad_batches_are_refused_and_store_nothing(change, error, message):
    agent = _agent()
    batch = _batch(5)
    change(batch)
    with pytest.raises(error, match=message):
        agent.update(batch)
    assert int(agent._algo.memory.size.numpy()) == 0


def test_update_needs_a_replay_memory():
    agent = batchrl.Agent.create("pendulum", SPACE, ACTIONS, num_envs=2, max_length=200)
    with pytest.raises(TypeError, match="needs an algorithm with a replay memory"):
        agent.update(_batch(5))


def test_observe_stores_the_final_observations_given_and_save_load_keeps_them(tmp_path):
    """Each stored transition's next observation is the `final_observation` of its step,
    not the observation its action was taken in (one-step returns: row 2 t + i is step t
    of environment i)."""
    agent = _agent()
    rng = np.random.default_rng(3)
    observations, finals = [], []
    for _ in range(15):
        observations.append(rng.uniform(-1, 1, (2, 3)).astype(np.float32))
        finals.append(rng.uniform(-1, 1, (2, 3)).astype(np.float32))
        agent.act(observations[-1])
        agent.observe(rng.normal(size=2), [False, False], [False, False],
                      final_observation=finals[-1])
    memory = agent._algo.memory
    assert int(memory.size.numpy()) == 30 and int(agent._algo.updates.numpy()) == 6
    np.testing.assert_array_equal(memory.storage["observ"][:30].numpy(),
                                  np.concatenate(observations))
    np.testing.assert_array_equal(memory.storage["nextob"][:30].numpy(),
                                  np.concatenate(finals))
    agent.save(tmp_path / "agent")
    loaded = batchrl.Agent.load(tmp_path / "agent")
    for key, variable in memory.storage.items():
        np.testing.assert_array_equal(loaded._algo.memory.storage[key].numpy(),
                                      variable.numpy(), err_msg=key)
    assert int(loaded._algo.updates.numpy()) == 6


@pytest.mark.parametrize("config, actions", [
    ("pendulum_sac", ACTIONS), ("cartpole_dqn", gym.spaces.Discrete(2))])
def test_observe_without_final_observation_is_refused_and_records_nothing(config, actions):
    """After a sampled act, `observe` needs the observation after the step: without it a
    transition would bootstrap from the observation its action was taken in."""
    agent = batchrl.Agent.create(config, SPACE, actions, num_envs=2, **SMALL)
    observation = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], np.float32)
    final = np.array([[-0.1, -0.2, -0.3], [-0.4, -0.5, -0.6]], np.float32)
    agent.act(observation)
    with pytest.raises(ValueError, match=r"needs final_observation, the observation after "
                                         r"the step"):
        agent.observe([1.0, 2.0], [False, True], [True, False])
    memory = agent._algo.memory
    assert agent.step == 0 and int(memory.size.numpy()) == 0
    agent.observe([1.0, 2.0], [False, True], [True, False], final_observation=final)
    assert agent.step == 2 and int(memory.size.numpy()) == 2
    np.testing.assert_array_equal(memory.storage["observ"][:2].numpy(), observation)
    np.testing.assert_array_equal(memory.storage["nextob"][:2].numpy(), final)
    np.testing.assert_allclose(memory.storage["discount"][:2].numpy(), [0.99, 0.0])


@pytest.mark.parametrize("save_replay", [False, True])
def test_save_writes_the_memory_once_whatever_save_replay(tmp_path, save_replay):
    """`save_replay` is the train command's: an Agent's one checkpoint holds its memory
    once either way, and `load` gets it back."""
    import tensorflow as tf

    agent = _agent(save_replay=save_replay)
    rng = np.random.default_rng(4)
    for _ in range(3):
        agent.act(rng.uniform(-1, 1, (2, 3)))
        agent.observe(rng.normal(size=2), [False, False], [False, False],
                      final_observation=rng.uniform(-1, 1, (2, 3)))
    agent.save(tmp_path / "agent")
    names = [name for name, _ in tf.train.list_variables(str(tmp_path / "agent" / "agent"))]
    assert [name for name in names if name.endswith("replay/storage/observ/.ATTRIBUTES/"
                                                     "VARIABLE_VALUE")] == [
        "progress/replay/storage/observ/.ATTRIBUTES/VARIABLE_VALUE"]
    loaded = batchrl.Agent.load(tmp_path / "agent")
    assert int(loaded._algo.memory.size.numpy()) == 6
    for key, variable in agent._algo.memory.storage.items():
        np.testing.assert_array_equal(loaded._algo.memory.storage[key].numpy(),
                                      variable.numpy(), err_msg=key)

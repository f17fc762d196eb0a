"""The action spaces the off-policy algorithms take: SAC and TD3 refuse the spaces a
continuous actor cannot serve (a `Discrete`-like leaf, an infinite bound) when they are
built, through `batchrl.Agent` and through `train`; DQN acts in, and learns from, a
`Discrete(n, start)` that does not start at 0, with one meaning of its actions everywhere
(the Agent, `train`'s environments, the exported model, the replay memory), and so does
PPO."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import batchrl
from batchrl import build, configs, environments
from batchrl.drivers.simulate import simulate
from batchrl.scripts import train

OBSERVATION = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SMALL = {"policy_layers": [8], "value_layers": [8], "batch_size": 4, "max_length": 20,
         "replay_capacity": 64, "learning_starts": 1000}
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
REFUSED = "needs Box actions with finite bounds; "


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
@pytest.mark.parametrize("action_space, problem", [
    (gym.spaces.Dict({"gripper": gym.spaces.Discrete(5), "move": BOX}),
     "action['gripper'] is Discrete(5)"),
    (gym.spaces.Tuple((BOX, gym.spaces.MultiBinary(2))), "action[1] is MultiBinary(2)"),
    (gym.spaces.MultiDiscrete([3, 4]), "action is MultiDiscrete([3 4])"),
    (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
     "action is Box(-inf, inf, (2,), float32), with an infinite bound"),
    (gym.spaces.Dict({"move": gym.spaces.Box(np.array([-1.0, 0.0], np.float32),
                                             np.array([1.0, np.inf], np.float32))}),
     "action['move'] is Box([-1.  0.], [ 1. inf], (2,), float32), with an infinite bound"),
])
def test_sac_and_td3_refuse_what_a_continuous_actor_cannot_serve(
        algorithm, action_space, problem):
    with pytest.raises(configs.ConfigError) as caught:
        batchrl.Agent.create("default", OBSERVATION, action_space, num_envs=2,
                             algorithm=algorithm, **SMALL)
    assert str(caught.value) == f"algorithm {algorithm!r}: {algorithm} {REFUSED}{problem}"


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_sac_and_td3_take_box_leaves_with_finite_bounds(algorithm):
    space = gym.spaces.Dict({"move": BOX, "turn": gym.spaces.Box(0.0, 1.0, (1,), np.float32)})
    agent = batchrl.Agent.create("default", OBSERVATION, space, num_envs=3,
                                 algorithm=algorithm, **SMALL)
    action = agent.act(np.zeros((3, 3), np.float32))
    assert action["move"].shape == (3, 2) and action["turn"].shape == (3, 1)
    assert all(space.contains({key: value[row] for key, value in action.items()})
               for row in range(3))
    agent.close()


@pytest.mark.parametrize("algorithm, env, problem", [
    ("sac", "batchrl.environments.nested_tasks:ReachAndChoose",
     "action['kind'] is Discrete(3, start=1)"),
    ("td3", "tests.echo_environments:EchoUnboundedBox",
     "action is Box(-inf, inf, (2,), float32), with an infinite bound"),
])
def test_train_refuses_them_in_one_line_writing_nothing(
        tmp_path, capsys, algorithm, env, problem):
    logdir = tmp_path / "run"
    assert train.main(["--config=pendulum_sac", f"--logdir={logdir}", "--no-progress",
                       "--set", f"algorithm={algorithm}", "--set", f"env={env}",
                       "--set", "max_length=20", "--set", "num_agents=2"]) == 2
    stderr = capsys.readouterr().err
    assert stderr == f"error: algorithm {algorithm!r}: {algorithm} {REFUSED}{problem}\n"
    assert not logdir.exists()


def test_dqn_agent_acts_in_the_space_and_stores_indices(tmp_path):
    start = -2  # Below 0: start + index and index - start differ in sign as well.
    space = gym.spaces.Discrete(3, start=start)
    agent = batchrl.Agent.create("default", OBSERVATION, space, num_envs=4,
                                 algorithm="dqn", **SMALL)
    rng = np.random.default_rng(0)
    taken = []
    for _ in range(6):  # Epsilon 1 at first: every action is drawn.
        action = agent.act(rng.uniform(-1, 1, (4, 3)).astype(np.float32))
        taken.append(action)
        agent.observe(np.zeros(4), np.zeros(4, bool), np.zeros(4, bool),
                      rng.uniform(-1, 1, (4, 3)).astype(np.float32))
    taken = np.concatenate(taken)
    assert taken.dtype == np.int32 and set(taken.tolist()) == {start, start + 1, start + 2}
    storage = agent._algo.memory.storage
    np.testing.assert_array_equal(storage["action"][:24].numpy(), taken - start)

    observation = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    greedy = agent.act(observation, deterministic=True)
    q = agent._algo.networks.policy(observation).numpy()
    np.testing.assert_array_equal(greedy, start + q.argmax(-1))
    model = tf.saved_model.load(str(agent.export(tmp_path / "model")))
    served = model.signatures["serving_default"](observation=tf.constant(observation))
    np.testing.assert_array_equal(served["action"].numpy(), greedy)
    sampled = model.signatures["sample"](observation=tf.constant(observation))["action"]
    assert all(space.contains(int(value)) for value in sampled.numpy())

    actions = np.array([start + 2, start, start + 1, start + 2], np.int64)
    agent.update({"observation": observation, "action": actions, "reward": np.zeros(4),
                  "terminated": np.zeros(4, bool), "next_observation": observation})
    np.testing.assert_array_equal(storage["action"][24:28].numpy(), actions - start)
    for outside in (start - 1, start + 3):
        with pytest.raises(ValueError, match="must be integers"):
            agent.update({"observation": observation[:1], "action": np.array([outside]),
                          "reward": np.zeros(1), "terminated": np.zeros(1, bool),
                          "next_observation": observation[:1]})
    agent.close()


def test_dqn_in_train_environments_sends_start_plus_the_stored_index():
    config = configs.load("default", {
        **SMALL, "algorithm": "dqn", "env": "tests.echo_environments:EchoOffsetDiscrete",
        "env_backend": "local", "num_agents": 3, "normalize_observ": False})
    batch_env = environments.create_batch(config)
    try:
        built = build.build(config, batch_env, process_eager=False)
        run = tf.function(lambda: simulate(built.batch_env, built.algo, False, False),
                          autograph=False)
        for _ in range(8):  # The environments refuse an action outside Discrete(3, start=1).
            run()
    finally:
        batch_env.close()
    storage = built.algo.memory.storage
    index, echoed = storage["action"][:24].numpy(), storage["nextob"][:24, 0].numpy()
    assert set(index.tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(echoed, index + 1)  # What the environment received.


def test_ppo_agent_acts_in_a_discrete_space_that_does_not_start_at_0():
    space = gym.spaces.Discrete(3, start=5)
    agent = batchrl.Agent.create("default", OBSERVATION, space, num_envs=4, max_length=20,
                                 network="feed_forward_categorical", policy_layers=[8],
                                 value_layers=[8])
    observation = np.random.default_rng(1).uniform(-1, 1, (4, 3)).astype(np.float32)
    taken = []
    for _ in range(10):  # An untrained policy: each action about a third of the time.
        taken.extend(agent.act(observation).tolist())
        agent.observe(np.zeros(4), np.zeros(4, bool), np.zeros(4, bool), observation)
    assert set(taken) == {5, 6, 7}
    assert set(agent.act(observation, deterministic=True).tolist()) <= {5, 6, 7}
    agent.close()

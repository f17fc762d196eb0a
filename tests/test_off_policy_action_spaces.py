"""The action spaces the off-policy algorithms take: SAC and TD3 refuse the spaces a
continuous actor cannot serve (a `Discrete`-like leaf, an infinite bound) when they are
built, through `batchrl.Agent` and through `train`."""

import gymnasium as gym
import numpy as np
import pytest

import batchrl
from batchrl import configs
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

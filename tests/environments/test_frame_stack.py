"""The `frame_stack` preprocessing step: the in-graph stack of each agent's last frames
(batchrl.environments.frame_stack) inside `simulate`, its config checks, and grayscale on
stacked RGB frames."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs, networks
from batchrl.algorithms.ppo import PPO
from batchrl.drivers.simulate import simulate
from batchrl.environments.frame_stack import FrameStack, stacked_space
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.networks import spec as network_spec
from batchrl.networks.torso import Torso
from tests.recording_environment import RecordingEnvironment

FRAMES = 3
CONV = [{"type": "conv2d", "filters": 2, "kernel": 2}, {"type": "flatten"},
        {"type": "dense", "units": 8}]


def _setup(durations, frames=FRAMES):
    envs = [RecordingEnvironment((4, 4, 1), (), low, high, observ_dtype=np.uint8,
                                 num_actions=3) for low, high in durations]
    for index, env in enumerate(envs):
        env.reset(seed=index)
        env.observations.clear()
    batch_env = FrameStack(InGraphBatchEnv(BatchEnv(envs, blocking=True)), frames)
    config = configs.load("default", {
        "network": CONV, "normalize_observ": False, "rollout_length": 6, "update_epochs": 1,
        "preprocessing": [{"type": "frame_stack", "frames": frames}, {"type": "scale"}]})
    config.update(network=networks.constructor(config.network), max_length=20)
    algo = PPO(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
               tf.Variable(False), config)

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    return envs, batch_env, algo, run


def test_stacks_each_agents_last_frames_across_episode_ends():
    envs, batch_env, algo, run = _setup([(2, 2), (3, 5)])
    assert batch_env.observation_space.shape == (4, 4, FRAMES)
    assert batch_env.observ.dtype == tf.uint8
    stacks = [None] * len(envs)
    seen = [0] * len(envs)
    began = 0
    # Per agent and step, the NumPy stacks before and after it and whether it ended the
    # episode (the after-stack is then the episode's final stack).
    steps = [[] for _ in envs]
    for _ in range(10):
        run(False, False)
        for index, env in enumerate(envs):
            new = env.observations[seen[index]:]
            seen[index] = len(env.observations)
            # The agent began an episode (also at the first step, which `simulate` resets
            # every agent for): its stack is filled with the first frame.
            if len(new) == 2:
                began += 1
                stacks[index] = [new[0]] * FRAMES
            before = np.concatenate(stacks[index], -1)
            stacks[index] = stacks[index][1:] + [new[-1]]
            after = np.concatenate(stacks[index], -1)
            steps[index].append((before, after, env.steps[-1] == env.durations[-1]))
            np.testing.assert_array_equal(batch_env.observ.numpy()[index], after)
    assert began > len(envs)  # Episodes ended and began again within the ten steps.
    # PPO stored the stacked frames as uint8: each step's stack and the one after it, the
    # final stack of its episode where the step ended one. Its rollouts of 6 steps were
    # updated on and emptied after step 6; steps 7 to 10 are in the memory.
    episodes, length = algo._memory.data()
    assert episodes["observ"].dtype == episodes["next_observ"].dtype == tf.uint8
    np.testing.assert_array_equal(length.numpy(), [4, 4])
    finals = 0
    for index, recorded in enumerate(steps):
        for stored, (before, after, done) in enumerate(recorded[-4:]):
            np.testing.assert_array_equal(episodes["observ"][index, stored], before)
            np.testing.assert_array_equal(episodes["next_observ"][index, stored], after)
            assert bool(episodes["done"][index, stored]) == done
            finals += done
    assert finals >= 2  # Agent 0's episodes of 2 steps end at steps 8 and 10.


@pytest.mark.parametrize("steps, message", [
    ([{"type": "scale"}, {"type": "frame_stack", "frames": 4}], "make it the first step"),
    ([{"type": "frame_stack", "frames": 1}], "at least 2"),
    ([{"type": "frame_stack"}], "missing key 'frames'"),
    ({"image": [{"type": "scale"}, {"type": "frame_stack", "frames": 4}]},
     "leaf 'image', step 2 .* make it the first step"),
])
def test_frame_stack_is_checked_with_the_config(steps, message):
    with pytest.raises(configs.ConfigError, match=message):
        network_spec.check_preprocessing(steps)


class _Recorded(gym.Wrapper):
    """Keeps every observation the environment returns (before any flattening)."""

    def __init__(self, env):
        super().__init__(env)
        self.observations = []

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        self.observations.append(observation)
        return observation, info

    def step(self, action):
        result = self.env.step(action)
        self.observations.append(result[0])
        return result


def test_stacks_the_frames_of_a_dict_entry_and_leaves_the_others():
    from batchrl import build
    from batchrl.environments.nested_tasks import ImageAndCue
    from batchrl.environments.wrappers import standard_wrappers

    recorded = [_Recorded(ImageAndCue()) for _ in range(2)]
    envs = [standard_wrappers(env, max_episode_steps=length)
            for env, length in zip(recorded, (2, 3), strict=True)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
        recorded[index].observations.clear()
    config = configs.load("image_and_cue", {
        "preprocessing": {"image": [{"type": "frame_stack", "frames": FRAMES},
                                    {"type": "scale"}]},
        "update_every": 2, "batch_size": 2})
    built = build.build(config, BatchEnv(envs, blocking=True), process_eager=False)
    batch_env, algo = built.batch_env, built.algo
    assert batch_env.observation_space.space["image"].shape == (8, 8, FRAMES)
    assert batch_env.observation_space.shape == (1 + 64 * FRAMES,)
    assert algo._memory.fields["observ_bytes"].shape[-1] == 64 * FRAMES  # Kept as bytes.

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    stacks, seen, began = [None, None], [0, 0], 0
    for _ in range(8):
        run(False, False)
        for index, env in enumerate(recorded):
            new = env.observations[seen[index]:]
            seen[index] = len(env.observations)
            if len(new) == 2:  # A new episode: its first image fills the stack.
                began += 1
                stacks[index] = [new[0]["image"]] * FRAMES
            stacks[index] = stacks[index][1:] + [new[-1]["image"]]
            expected = np.concatenate([new[-1]["cue"],
                                       np.concatenate(stacks[index], -1).reshape(-1)])
            np.testing.assert_array_equal(batch_env.observ.numpy()[index], expected)
    assert began > 2  # Episodes ended and began again.


def test_stacked_space_of_dict_entries_names_a_bad_entry():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (2, 2, 1), np.uint8),
                             "choice": gym.spaces.Discrete(2)})
    stacked = stacked_space(space, {"image": 4})
    assert stacked["image"].shape == (2, 2, 4) and stacked["choice"] == space["choice"]
    with pytest.raises(ValueError, match="Box observation entry 'choice' with at least one"):
        stacked_space(space, {"choice": 2})
    with pytest.raises(ValueError, match="entry 'imag': the observation has the entries"):
        stacked_space(space, {"imag": 2})


def test_stacked_space_repeats_the_bounds_on_the_last_axis():
    space = gym.spaces.Box(np.array([0.0, -1.0], np.float32), np.array([1.0, 2.0], np.float32))
    stacked = stacked_space(space, 3)
    assert stacked.shape == (6,) and stacked.dtype == np.float32
    np.testing.assert_array_equal(stacked.low, [0, -1] * 3)
    np.testing.assert_array_equal(stacked.high, [1, 2] * 3)
    with pytest.raises(ValueError, match="at least 2 frames"):
        FrameStack(None, 1)


def test_grayscale_takes_each_stacked_rgb_frame_apart():
    space = stacked_space(gym.spaces.Box(0, 255, (2, 2, 3), np.uint8), 2)
    steps = network_spec.check_preprocessing(
        [{"type": "frame_stack", "frames": 2}, {"type": "grayscale"}])
    torso = Torso(network_spec.check_layers([{"type": "flatten"}]), steps, space)
    frames = np.random.default_rng(0).integers(0, 256, (1, 1, 2, 2, 6)).astype(np.uint8)
    luma = np.array([0.299, 0.587, 0.114], np.float32)
    expected = np.stack([frames[..., :3] @ luma, frames[..., 3:] @ luma], -1)
    np.testing.assert_allclose(torso(frames).numpy(), expected.reshape(1, 1, 8), rtol=1e-5)
    with pytest.raises(ValueError, match="3 per stacked frame"):
        Torso(network_spec.check_layers([{"type": "flatten"}]), steps[1:],
              gym.spaces.Box(0, 255, (2, 2, 4), np.uint8))


def test_the_agent_leaves_stacking_to_the_application():
    from batchrl import Agent

    config = configs.load("default", {
        "network": CONV, "max_length": 10,
        "preprocessing": [{"type": "frame_stack", "frames": 2}]})
    with pytest.raises(configs.ConfigError, match="FrameStackObservation"):
        Agent(config, gym.spaces.Box(0, 255, (4, 4, 1), np.uint8), gym.spaces.Discrete(2))

"""Byte elements of nested observations kept as uint8: the split and join of
`ObservationStorage`, and the episode and replay memories that use it."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, configs
from batchrl.drivers.simulate import simulate
from batchrl.environments.local import BatchEnv
from batchrl.environments.nested_tasks import ImageAndCue
from batchrl.environments.wrappers import standard_wrappers
from batchrl.memories.observation_storage import ObservationStorage
from batchrl.memories.replay import ReplayMemory
from batchrl.spaces import nested

SPACE = gym.spaces.Dict({
    "bits": gym.spaces.MultiBinary(2),
    "choice": gym.spaces.Discrete(3),
    "image": gym.spaces.Box(0, 255, (4, 4, 1), np.uint8),
    "position": gym.spaces.Box(-10.0, 10.0, (2,), np.float32)})
FLAT = nested.FlatObservationSpace(SPACE)


def _observations(count, seed=0):
    SPACE.seed(seed)
    return np.stack([gym.spaces.flatten(SPACE, SPACE.sample()) for _ in range(count)]
                    ).astype(np.float32)


def test_the_byte_valued_elements_are_pixels_one_hot_and_bits():
    # Flattened in key order: bits (2), choice one-hot (3), image (16), position (2).
    np.testing.assert_array_equal(FLAT.byte_valued, [True] * 21 + [False] * 2)


def test_split_and_join_give_back_every_observation_exactly():
    storage = ObservationStorage.for_space(FLAT, FLAT.shape, tf.float32)
    assert storage.split
    assert storage.specs("observ") == {"observ": ((2,), tf.float32),
                                       "observ_bytes": ((21,), tf.uint8)}
    observ = _observations(12).reshape(3, 4, 23)  # Any leading axes, e.g. [batch, time].
    fields = storage.encode("observ", observ)
    assert fields["observ_bytes"].dtype == tf.uint8 and fields["observ_bytes"].shape == (3, 4, 21)
    np.testing.assert_array_equal(fields["observ"].numpy(), observ[..., 21:])
    np.testing.assert_array_equal(storage.decode("observ", fields).numpy(), observ)


def test_observations_of_bytes_alone_keep_one_uint8_field():
    space = nested.FlatObservationSpace(gym.spaces.Dict({
        "choice": gym.spaces.Discrete(3), "frame": gym.spaces.Box(0, 1, (2, 2), bool)}))
    storage = ObservationStorage.for_space(space, space.shape, tf.float32)
    assert storage.specs("o") == {"o_bytes": ((7,), tf.uint8)}
    space.space.seed(0)
    observ = np.stack([gym.spaces.flatten(space.space, space.space.sample())
                       for _ in range(6)]).astype(np.float32)
    fields = storage.encode("o", observ)
    assert set(fields) == {"o_bytes"}
    np.testing.assert_array_equal(storage.decode("o", fields).numpy(), observ)


def test_normalized_elements_stay_float():
    normalized = nested.normalized_elements(FLAT)  # The image and the position.
    storage = ObservationStorage.for_space(FLAT, FLAT.shape, tf.float32, normalized)
    assert storage.specs("o") == {"o": ((18,), tf.float32), "o_bytes": ((5,), tf.uint8)}
    observ = _observations(5)
    observ[:, 5:] = np.random.default_rng(0).normal(size=(5, 18))  # Normalized values.
    np.testing.assert_array_equal(
        storage.decode("o", storage.encode("o", observ)).numpy(), observ)


@pytest.mark.parametrize("space, dtype", [
    (gym.spaces.Box(0, 255, (4, 4, 1), np.uint8), tf.uint8),  # Stored as it is, uint8.
    (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), tf.float32),
    (nested.FlatObservationSpace(gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))})),
     tf.float32)])
def test_observations_without_byte_elements_keep_one_field(space, dtype):
    storage = ObservationStorage.for_space(space, space.shape, dtype)
    assert not storage.split
    assert storage.specs("observ") == {"observ": (space.shape, dtype)}
    observ = tf.cast(np.arange(2 * np.prod(space.shape)).reshape((2,) + space.shape) % 7,
                     dtype)
    fields = storage.encode("observ", observ)
    assert set(fields) == {"observ"} and fields["observ"].dtype == dtype
    np.testing.assert_array_equal(storage.decode("observ", fields).numpy(), observ.numpy())


def test_a_mask_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"byte_elements of shape \(3,\), expected \(23,\)"):
        ObservationStorage((23,), tf.float32, np.ones(3, bool))


@pytest.mark.parametrize("n_step", [1, 3])
def test_the_replay_memory_keeps_bytes_and_samples_the_observations_exactly(n_step):
    memory = ReplayMemory(((23,), tf.float32), ((), tf.int64), 64, 2, n_step=n_step,
                          byte_elements=FLAT.byte_valued)
    plain = ReplayMemory(((23,), tf.float32), ((), tf.int64), 64, 2, n_step=n_step)
    assert memory.storage["observ_bytes"].dtype == tf.uint8
    assert memory.storage["observ"].shape == (65, 2)
    assert plain.bytes_per_transition - memory.bytes_per_transition == 2 * 21 * 3
    observations = _observations(11 * 2).reshape(11, 2, 23)
    for step in range(10):
        done = np.array([step == 4, False])
        memory.add([0, 1], observations[step], [step, step], [1.0, 1.0], done,
                   np.zeros(2, bool), observations[step + 1])
    batch = memory.sample(40)
    index = batch["index"].numpy()
    stored = memory.storage["observ"].numpy()[index]
    for row, observ in enumerate(batch["observ"].numpy()):
        match = np.flatnonzero((observations.reshape(-1, 23) == observ).all(1))
        assert match.size, "each sampled observation is one that was added"
        np.testing.assert_array_equal(observ[21:], stored[row])
    following = {tuple(o) for o in observations.reshape(-1, 23)}
    assert all(tuple(o) in following for o in batch["nextob"].numpy())


def test_the_replay_memory_samples_observations_of_bytes_alone():
    memory = ReplayMemory(((21,), tf.float32), ((), tf.int64), 8, 1,
                          byte_elements=np.ones(21, bool))
    assert "observ" not in memory.storage
    observations = _observations(3)[:, :21]
    memory.add([0], observations[:1], [0], [1.0], [False], [False], observations[1:2])
    memory.add([0], observations[1:2], [1], [1.0], [True], [False], observations[2:3])
    batch = memory.sample(16)
    np.testing.assert_array_equal(batch["observ"].numpy(), observations[batch["index"]])
    np.testing.assert_array_equal(batch["nextob"].numpy(), observations[batch["index"] + 1])


def test_ppo_keeps_the_image_of_a_dict_observation_as_bytes():
    envs = [standard_wrappers(ImageAndCue(), max_episode_steps=5) for _ in range(2)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    config = configs.load("image_and_cue", {"update_every": 2, "max_length": 5,
                                            "batch_size": 2, "chunk_length": 5})
    built = build.build(config, BatchEnv(envs, blocking=True), process_eager=False)
    algo, batch_env = built.algo, built.batch_env
    fields = algo._memory.fields
    assert fields["observ_bytes"].dtype == tf.uint8
    assert fields["observ_bytes"].shape[2:] == (64,)  # The image; the cue stays float32.
    assert fields["observ"].shape[2:] == (1,)

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    seen = []
    for _ in range(4):
        run(False, False)
        seen.append(batch_env.observ.numpy().copy())  # What the next step acts on.
    episodes, length = algo._episodes.data()
    np.testing.assert_array_equal(length.numpy(), [4, 4])
    stored = algo._observ_storage.decode("observ", episodes)[:, :4].numpy()
    np.testing.assert_array_equal(stored[:, 1:], np.stack(seen[:3], 1))
    # Each image has its one bright pixel, the cue is -1 or 1.
    np.testing.assert_array_equal((stored[..., 1:] == 255).sum(-1), 1)
    np.testing.assert_array_equal(np.abs(stored[..., 0]), 1)


def test_dqn_replays_the_image_of_a_dict_observation_from_bytes():
    envs = [standard_wrappers(ImageAndCue(), max_episode_steps=5) for _ in range(2)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    network = {"leaves": {"image": [{"type": "conv2d", "filters": 4, "kernel": 3},
                                    {"type": "flatten"}],
                          "cue": [{"type": "dense", "units": 4}]},
               "layers": [{"type": "dense", "units": 16}]}
    config = configs.load("default", {
        "algorithm": "dqn", "network": network, "preprocessing": {"image": [{"type": "scale"}]},
        "normalize_observ": False, "max_length": 5, "replay_capacity": 100,
        "learning_starts": 8, "batch_size": 4, "jit_update": False})
    built = build.build(config, BatchEnv(envs, blocking=True), process_eager=False)
    algo, batch_env = built.algo, built.batch_env
    storage = algo.memory.storage
    assert storage["observ_bytes"].dtype == tf.uint8 and storage["observ_bytes"].shape[1:] == (64,)
    assert storage["nextob_bytes"].dtype == tf.uint8 and storage["observ"].shape[1:] == (1,)

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    for _ in range(10):
        run(False, False)
    assert int(algo.updates.numpy()) > 0
    images = storage["observ_bytes"].numpy()[:int(algo.memory.size)]
    np.testing.assert_array_equal((images == 255).sum(-1), 1)  # One bright pixel each.

"""Image observations end to end: the Agent and its SavedModel on uint8 frames, with the
preprocessing inside the model."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import batchrl

CONV = [{"type": "conv2d", "filters": 4, "kernel": 3, "stride": 2}, {"type": "flatten"},
        {"type": "dense", "units": 16}]


@pytest.mark.parametrize("action_space", [
    gym.spaces.Box(-2.0, 2.0, (2,), np.float32), gym.spaces.Discrete(3)])
def test_the_exported_model_takes_raw_frames_and_acts_as_the_agent(action_space, tmp_path):
    space = gym.spaces.Box(0, 255, (9, 9, 3), np.uint8)
    agent = batchrl.Agent.create(
        "default", space, action_space, num_envs=4, seed=0, network=CONV,
        preprocessing=[{"type": "grayscale"}, {"type": "scale"}], normalize_observ=False,
        rollout_length=4, update_epochs=1, max_length=50)
    rng = np.random.default_rng(0)
    for _ in range(6):  # Past an update, so that the weights are not the initial ones.
        agent.act(rng.integers(0, 256, (4, 9, 9, 3), dtype=np.uint8))
        agent.observe(rng.normal(size=4), np.zeros(4, bool), np.zeros(4, bool),
                      final_observation=rng.integers(0, 256, (4, 9, 9, 3), dtype=np.uint8))
    frames = rng.integers(0, 256, (4, 9, 9, 3), dtype=np.uint8)
    expected = agent.act(frames, deterministic=True)
    model = tf.saved_model.load(str(agent.export(tmp_path / "model")))
    serve = model.signatures["serving_default"]
    assert serve.structured_input_signature[1]["observation"].dtype == tf.uint8
    served = serve(observation=tf.constant(frames))["action"].numpy()
    np.testing.assert_allclose(served, expected, atol=1e-5)
    agent.close()

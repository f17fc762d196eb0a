"""`python -m batchrl.scripts.export`: a run's policy as a SavedModel served without batchrl.

The commands run in this process (`main(argv)`: TensorFlow starts once); the models are
served in one process that never imports batchrl."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl import build, environments
from batchrl.environments.local import BatchEnv
from batchrl.scripts import export, train
from batchrl.scripts.visualize import find_run, restore

# Two agents, 50-step episodes, an update every 2 episodes (every 100 steps): checkpoints
# after the first update (ckpt-100) and the second (ckpt-200).
SHORT = ["--no-progress", "--set", "steps=200", "--set", "eval_every=100",
         "--set", "num_agents=2", "--set", "max_length=50", "--set", "update_every=2",
         "--set", "update_epochs=1", "--set", "eval_episodes=1", "--set", "env_backend=local"]
CHECKPOINTS = ("ckpt-100", "ckpt-200")
# argv: observations, then a model directory and an output file for each model.
_SERVE = """
import sys
import numpy as np
import tensorflow as tf
observation = tf.constant(np.load(sys.argv[1]))
for model, output in zip(sys.argv[2::2], sys.argv[3::2]):
    model = tf.saved_model.load(model)
    mean = model.signatures["serving_default"](observation=observation)["action"].numpy()
    again = model.signatures["serving_default"](observation=observation)["action"].numpy()
    sampled = model.signatures["sample"](observation=observation)["action"].numpy()
    np.savez(output, mean=mean, again=again, sampled=sampled)
assert "batchrl" not in sys.modules
"""


def _pendulum_observations(count, random):
    """Observations of Pendulum-v1: `(cos angle, sin angle, angular velocity)`."""
    angle = random.uniform(-np.pi, np.pi, count)
    velocity = random.uniform(-8, 8, count)
    return np.stack([np.cos(angle), np.sin(angle), velocity], 1).astype(np.float32)


def _restored_actions(logdir, checkpoint, observation):
    """The mean actions of the policy of `checkpoint` restored as `visualize` and `export`
    restore it, in the policy's space [-1, 1], with its observation normalizer checked
    against the checkpoint's values."""
    config, path = find_run(logdir, checkpoint)
    env = environments.create(environments.gymnasium_id(config.env),
                              environments.episode_limit(config), kwargs=config.env_kwargs)
    agent = build.build(config, BatchEnv([env], blocking=True))
    restore(agent, path)
    stored = tf.train.load_checkpoint(path)
    normalizer = agent.algo.checkpoint_state["observ_filter"]
    assert normalizer.count.numpy() == stored.get_tensor(
        "observ_filter/_count/.ATTRIBUTES/VARIABLE_VALUE") > 0
    np.testing.assert_array_equal(normalizer.mean.numpy(), stored.get_tensor(
        "observ_filter/_mean/.ATTRIBUTES/VARIABLE_VALUE").astype(np.float32))
    state = tf.zeros([observation.shape[0], agent.algo.state_size])
    actions = agent.algo.policy_action(tf.constant(observation), state)[0].numpy()
    env.close()
    return actions


def test_exports_the_runs_checkpoint_in_the_environments_action_space(tmp_path, capsys):
    """The served mean actions of each checkpoint equal those of the policy restored from
    it (normalizer and all), mapped from [-1, 1] onto Pendulum's torque bounds, within
    1e-5."""
    logdir = tmp_path / "run"
    assert train.main(["--config=pendulum", f"--logdir={logdir}", *SHORT]) == 0
    observation = _pendulum_observations(50, np.random.default_rng(0))
    np.save(tmp_path / "observation.npy", observation)
    models = []
    for name in CHECKPOINTS:
        outdir = tmp_path / name
        capsys.readouterr()
        assert export.main([f"--logdir={logdir}", f"--outdir={outdir}",
                            f"--checkpoint={logdir / name}"]) == 0
        assert f"to {outdir}" in capsys.readouterr().out
        models += [str(outdir), str(tmp_path / f"{name}.npz")]
    result = subprocess.run(
        [sys.executable, "-c", _SERVE, str(tmp_path / "observation.npy"), *models],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    served = {}
    for name in CHECKPOINTS:
        with np.load(tmp_path / f"{name}.npz") as outputs:
            served[name] = dict(outputs)
    bounds = gym.make("Pendulum-v1").action_space
    for name, actions in served.items():
        restored = _restored_actions(logdir, str(logdir / name), observation)
        expected = bounds.low + (np.clip(restored, -1, 1) + 1) / 2 * (bounds.high - bounds.low)
        np.testing.assert_allclose(actions["mean"], expected, atol=1e-5, err_msg=name)
    early, late = (served[name] for name in CHECKPOINTS)
    assert late["mean"].shape == (50, 1) and late["mean"].dtype == np.float32
    assert np.abs(late["mean"]).max() <= 2.0, "Pendulum's torque bounds are [-2, 2]"
    np.testing.assert_array_equal(late["mean"], late["again"])
    assert not np.allclose(late["sampled"], late["mean"])
    assert not np.allclose(early["mean"], late["mean"]), "each checkpoint's own"


def test_run_without_checkpoint_is_a_one_line_error(tmp_path, capsys):
    assert export.main([f"--logdir={tmp_path}", f"--outdir={tmp_path / 'out'}"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().count("\n") == 0 and "config.yaml" in stderr

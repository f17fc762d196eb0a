"""`python -m batchrl.scripts.export`: a run's policy as a SavedModel served without batchrl."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np

SHORT = ["--set", "steps=1000", "--set", "eval_every=500", "--set", "num_agents=2",
         "--set", "update_every=2", "--set", "update_epochs=1", "--set", "eval_episodes=1",
         "--set", "env_backend=local"]
_SERVE = """
import sys
import numpy as np
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
observation = tf.constant(np.load(sys.argv[2]))
mean = model.signatures["serving_default"](observation=observation)["action"].numpy()
again = model.signatures["serving_default"](observation=observation)["action"].numpy()
sampled = model.signatures["sample"](observation=observation)["action"].numpy()
assert "batchrl" not in sys.modules
np.savez(sys.argv[3], mean=mean, again=again, sampled=sampled)
"""
# The policy of each checkpoint restored as `visualize` and `export` restore it, with its
# observation normalizer checked against the checkpoint's values: the mean actions in the
# policy's space, [-1, 1] (argv: run, observations, output, checkpoints...).
_RESTORED = """
import sys
import numpy as np
import tensorflow as tf
from batchrl import build, environments
from batchrl.scripts.visualize import find_run, restore
from batchrl.environments.local import BatchEnv
logdir, observation, output, *checkpoints = sys.argv[1:]
observation = tf.constant(np.load(observation))
actions = {}
for path in checkpoints:
    config, checkpoint = find_run(logdir, path)
    env = environments.create(environments.gymnasium_id(config.env),
                              environments.episode_limit(config), kwargs=config.env_kwargs)
    agent = build.build(config, BatchEnv([env], blocking=True))
    restore(agent, checkpoint)
    stored = tf.train.load_checkpoint(checkpoint)
    normalizer = agent.algo.checkpoint_state["observ_filter"]
    assert normalizer.count.numpy() == stored.get_tensor(
        "observ_filter/_count/.ATTRIBUTES/VARIABLE_VALUE") > 0
    np.testing.assert_array_equal(normalizer.mean.numpy(), stored.get_tensor(
        "observ_filter/_mean/.ATTRIBUTES/VARIABLE_VALUE").astype(np.float32))
    state = tf.zeros([observation.shape[0], agent.algo.state_size])
    actions[path.rsplit("/", 1)[-1]] = agent.algo.policy_action(observation, state)[0].numpy()
np.savez(output, **actions)
"""


def _run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, env=env)


def _serve(model, observation, tmp_path):
    np.save(tmp_path / "observation.npy", observation)
    result = _run("-c", _SERVE, str(model), str(tmp_path / "observation.npy"),
                  str(tmp_path / "served.npz"))
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(tmp_path / "served.npz") as served:
        return dict(served)


def _pendulum_observations(count, random):
    """Observations of Pendulum-v1: `(cos angle, sin angle, angular velocity)`."""
    angle = random.uniform(-np.pi, np.pi, count)
    velocity = random.uniform(-8, 8, count)
    return np.stack([np.cos(angle), np.sin(angle), velocity], 1).astype(np.float32)


def test_exports_the_runs_checkpoint_in_the_environments_action_space(tmp_path):
    """The served mean actions of each checkpoint equal those of the policy restored from
    it (normalizer and all), mapped from [-1, 1] onto Pendulum's torque bounds, within
    1e-5."""
    logdir = tmp_path / "run"
    result = _run("-m", "batchrl.scripts.train", "--config=pendulum", f"--logdir={logdir}",
                  *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    observation = _pendulum_observations(50, np.random.default_rng(0))
    served = {}
    for name in ("ckpt-500", "ckpt-1000"):
        outdir = tmp_path / name
        result = _run("-m", "batchrl.scripts.export", f"--logdir={logdir}",
                      f"--outdir={outdir}", f"--checkpoint={logdir / name}")
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"to {outdir}" in result.stdout
        served[name] = _serve(outdir, observation, tmp_path)
    result = _run("-c", _RESTORED, str(logdir), str(tmp_path / "observation.npy"),
                  str(tmp_path / "restored.npz"), *(str(logdir / name) for name in served))
    assert result.returncode == 0, result.stderr[-3000:]
    bounds = gym.make("Pendulum-v1").action_space
    with np.load(tmp_path / "restored.npz") as restored:
        for name, actions in served.items():
            expected = bounds.low + (np.clip(restored[name], -1, 1) + 1) / 2 * (
                bounds.high - bounds.low)
            np.testing.assert_allclose(actions["mean"], expected, atol=1e-5, err_msg=name)
    late = served["ckpt-1000"]
    assert late["mean"].shape == (50, 1) and late["mean"].dtype == np.float32
    assert np.abs(late["mean"]).max() <= 2.0, "Pendulum's torque bounds are [-2, 2]"
    np.testing.assert_array_equal(late["mean"], late["again"])
    assert not np.allclose(late["sampled"], late["mean"])
    assert not np.allclose(served["ckpt-500"]["mean"], late["mean"]), "each checkpoint's own"


def test_run_without_checkpoint_is_a_one_line_error(tmp_path):
    result = _run("-m", "batchrl.scripts.export", f"--logdir={tmp_path}",
                  f"--outdir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "config.yaml" in result.stderr

"""`python -m batchrl.scripts.export`: a run's policy as a SavedModel served without batchrl."""

import os
import subprocess
import sys

import numpy as np

SHORT = ["--set", "steps=1000", "--set", "eval_every=500", "--set", "num_agents=2",
         "--set", "update_every=2", "--set", "update_epochs=1", "--set", "eval_episodes=1",
         "--set", "env_processes=false"]
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


def test_exports_the_runs_checkpoint_in_the_environments_action_space(tmp_path):
    logdir = tmp_path / "run"
    result = _run("-m", "batchrl.scripts.train", "--config=pendulum", f"--logdir={logdir}",
                  *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    observation = np.random.default_rng(0).uniform(-1, 1, (50, 3)).astype(np.float32)
    served = {}
    for name in ("ckpt-500", "ckpt-1000"):
        outdir = tmp_path / name
        result = _run("-m", "batchrl.scripts.export", f"--logdir={logdir}",
                      f"--outdir={outdir}", f"--checkpoint={logdir / name}")
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"to {outdir}" in result.stdout
        served[name] = _serve(outdir, observation, tmp_path)
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

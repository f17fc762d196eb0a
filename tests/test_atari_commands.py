"""`visualize` and `export` of an Atari run on EnvPool (a task Gymnasium does not have here):
the export takes its spaces from EnvPool's spec and serves the restored policy, the video
shows the observations enlarged, and neither command prints TensorFlow's harmless uint8
ERROR line."""

import os
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest
import tensorflow as tf

# What TensorFlow's C++ logging writes to file descriptor 2 for uint8 ops on a CPU without
# AVX-512 (`quiet.HARMLESS_LOG_LINES`), and a line that must still reach the user.
HARMLESS = ("E0000 00:00:1795000000.000000    1234 util.cc:131] oneDNN supports DT_UINT8 "
            "only on platforms with AVX-512. Falling back to the default Eigen-based "
            "implementation if present.")
OTHER = "E0000 00:00:1795000000.000000    1234 other.cc:7] a C++ error the user must see"
# Runs a command's `main` (argv[1]: visualize or export, the rest its flags) with its work
# function (`visualize` / `export_run`) writing both lines to fd 2 first, as TensorFlow does.
_NOISY = """
import os, sys
from batchrl.scripts import export, visualize
module = {"visualize": visualize, "export": export}[sys.argv[1]]
name = {"visualize": "visualize", "export": "export_run"}[sys.argv[1]]
work = getattr(module, name)

def noisy(*args, **kwargs):
    os.write(2, (sys.argv[2] + "\\n" + sys.argv[3] + "\\n").encode())
    return work(*args, **kwargs)

setattr(module, name, noisy)
sys.exit(module.main(sys.argv[4:]))
"""


def _user_environment():
    """The environment of a user who set no TensorFlow variable (the tests' conftest sets
    TF_CPP_MIN_LOG_LEVEL)."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def _noisy(command, *flags):
    return subprocess.run([sys.executable, "-c", _NOISY, command, HARMLESS, OTHER, *flags],
                          capture_output=True, text=True, timeout=300,
                          env=_user_environment())


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("atari") / "pong"
    result = subprocess.run(
        [sys.executable, "-m", "batchrl.scripts.train", "--config=pong", f"--logdir={logdir}",
         "--set", "steps=32", "--set", "num_agents=2", "--set", "rollout_length=8",
         "--set", "batch_size=8", "--set", "eval_every=32", "--set", "eval_episodes=0"],
        capture_output=True, text=True, timeout=300, env=_user_environment())
    assert result.returncode == 0, result.stderr
    assert "oneDNN supports DT_UINT8" not in result.stderr  # A harmless line, dropped.
    return logdir


def test_export_takes_the_spaces_from_envpool_and_serves_the_restored_policy(
        pong_run, tmp_path):
    outdir = tmp_path / "model"
    result = _noisy("export", f"--logdir={pong_run}", f"--outdir={outdir}")
    assert result.returncode == 0, result.stderr
    assert f"to {outdir}" in result.stdout
    assert "oneDNN supports DT_UINT8" not in result.stderr
    assert OTHER in result.stderr, result.stderr
    model = tf.saved_model.load(str(outdir))
    signature = model.signatures["serving_default"]
    (name, spec), = signature.structured_input_signature[1].items()
    assert name == "observation" and spec.dtype == tf.uint8
    assert spec.shape.as_list() == [None, 4, 84, 84]  # Pong's stacks of 84 x 84 frames.
    frames = np.random.default_rng(0).integers(0, 256, (16, 4, 84, 84), np.uint8)
    served = signature(observation=tf.constant(frames))["action"].numpy()
    np.testing.assert_array_equal(served, _restored_actions(pong_run, frames))
    assert served.dtype == np.int32 and ((served >= 0) & (served < 6)).all()  # Discrete(6).


def _restored_actions(logdir, frames):
    """The mode actions of the run's policy restored as training built it: on an EnvPool
    batch of the task, through the algorithm (the reference for the exported model)."""
    from batchrl import build, configs, environments
    from batchrl.scripts.visualize import find_run, restore

    config, checkpoint = find_run(logdir)
    batch_env = environments.create_batch(configs.Config(config, num_agents=1))
    try:
        agent = build.build(config, batch_env, process_eager=False)
        restore(agent, checkpoint)
        state = tf.zeros([len(frames), agent.algo.state_size])
        return agent.algo.policy_action(tf.constant(frames), state)[0].numpy()
    finally:
        batch_env.close()


def test_visualize_shows_the_observations_enlarged(pong_run, tmp_path):
    outdir = tmp_path / "videos"
    result = _noisy("visualize", f"--logdir={pong_run}", f"--outdir={outdir}",
                    "--episodes=1", "--max-steps=40")
    assert result.returncode == 0, result.stderr
    assert "oneDNN supports DT_UINT8" not in result.stderr
    assert OTHER in result.stderr, result.stderr
    with imageio.get_reader(outdir / "episode-000.mp4") as reader:
        assert reader.get_meta_data()["fps"] == 15  # 60 / EnvPool's frame skip of 4.
        frames = [frame for frame in reader]
    assert len(frames) == 40
    assert all(frame.shape == (168, 168, 3) for frame in frames)  # 84 x 84, each pixel 2 x 2.
    assert np.ptp(np.stack(frames)) > 50  # A picture, not a blank.

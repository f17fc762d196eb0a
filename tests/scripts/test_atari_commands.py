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
# Runs `export`'s and then `visualize`'s `main` in one process (argv: HARMLESS, OTHER, then
# export's flags, "--", visualize's flags), each with its work function (`export_run` /
# `visualize`) writing both lines to fd 2 first, as TensorFlow does; a line `=== visualize`
# on stdout and fd 2 divides the output of the two; the exit code is both codes' maximum.
_NOISY = """
import os, sys
from batchrl.scripts import export, visualize
harmless, other, *flags = sys.argv[1:]
divide = flags.index("--")

def noisy(module, name):
    work = getattr(module, name)

    def wrapped(*args, **kwargs):
        os.write(2, (harmless + "\\n" + other + "\\n").encode())
        return work(*args, **kwargs)

    setattr(module, name, wrapped)

noisy(export, "export_run")
noisy(visualize, "visualize")
exported = export.main(flags[:divide])
print("=== visualize", flush=True)
os.write(2, b"=== visualize\\n")
sys.exit(max(exported, visualize.main(flags[divide + 1:])))
"""


def _user_environment():
    """The environment of a user who set no TensorFlow variable (the tests' conftest sets
    TF_CPP_MIN_LOG_LEVEL)."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


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


@pytest.fixture(scope="module")
def commands(pong_run, tmp_path_factory):
    """`export` and `visualize` of the Pong run in one new process (`_NOISY`): its exit
    code, the two output directories, and `{command: (stdout, stderr)}`."""
    outdir = tmp_path_factory.mktemp("commands")
    model, videos = outdir / "model", outdir / "videos"
    result = subprocess.run(
        [sys.executable, "-c", _NOISY, HARMLESS, OTHER,
         f"--logdir={pong_run}", f"--outdir={model}", "--",
         f"--logdir={pong_run}", f"--outdir={videos}", "--episodes=1", "--max-steps=40"],
        capture_output=True, text=True, timeout=300, env=_user_environment())
    stdout, stderr = (text.split("=== visualize\n") for text in (result.stdout, result.stderr))
    assert len(stdout) == len(stderr) == 2, result.stderr
    output = {"export": (stdout[0], stderr[0]), "visualize": (stdout[1], stderr[1])}
    return result.returncode, model, videos, output


def test_export_takes_the_spaces_from_envpool_and_serves_the_restored_policy(
        pong_run, commands):
    code, outdir, _, output = commands
    stdout, stderr = output["export"]
    assert code == 0, stderr
    assert f"to {outdir}" in stdout
    assert "oneDNN supports DT_UINT8" not in stderr
    assert OTHER in stderr, stderr
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


def test_visualize_shows_the_observations_enlarged(commands):
    code, _, outdir, output = commands
    stdout, stderr = output["visualize"]
    assert code == 0, stderr
    assert "Recording 1 episode(s)" in stdout
    assert "oneDNN supports DT_UINT8" not in stderr
    assert OTHER in stderr, stderr
    with imageio.get_reader(outdir / "episode-000.mp4") as reader:
        assert reader.get_meta_data()["fps"] == 15  # 60 / EnvPool's frame skip of 4.
        frames = [frame for frame in reader]
    assert len(frames) == 40
    assert all(frame.shape == (168, 168, 3) for frame in frames)  # 84 x 84, each pixel 2 x 2.
    assert np.ptp(np.stack(frames)) > 50  # A picture, not a blank.

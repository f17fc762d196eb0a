"""`visualize` and `export` of an Atari run on EnvPool (a task Gymnasium does not have here):
the export takes its spaces from EnvPool's spec and serves the restored policy, the video
shows the observations enlarged, and neither command prints TensorFlow's harmless uint8
ERROR line."""

import os
import re
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
# Runs `train`'s, `export`'s and then `visualize`'s `main` in one process (argv: HARMLESS,
# OTHER, then train's flags, "--", export's flags, "--", visualize's flags): train as it is
# (TensorFlow's own uint8 line, if this CPU prints it, comes then), then export and visualize
# each with its work function (`export_run` / `visualize`) writing both lines to fd 2 first,
# as TensorFlow does; a line `=== export` / `=== visualize` on stdout and fd 2 divides the
# output of the three, and train's exit code is its stdout's last line; the exit code is
# the three codes' maximum.
_NOISY = """
import os, sys
from batchrl.scripts import export, train, visualize
harmless, other, *flags = sys.argv[1:]
first = flags.index("--")
second = flags.index("--", first + 1)

def noisy(module, name):
    work = getattr(module, name)

    def wrapped(*args, **kwargs):
        os.write(2, (harmless + "\\n" + other + "\\n").encode())
        return work(*args, **kwargs)

    setattr(module, name, wrapped)

trained = train.main(flags[:first])
print(f"train exit {trained}", flush=True)
noisy(export, "export_run")
noisy(visualize, "visualize")
codes = [trained]
for name, program, argv in (("export", export, flags[first + 1:second]),
                            ("visualize", visualize, flags[second + 1:])):
    print(f"=== {name}", flush=True)
    os.write(2, f"=== {name}\\n".encode())
    codes.append(program.main(argv))
sys.exit(max(codes))
"""


def _user_environment():
    """The environment of a user who set no TensorFlow variable (the tests' conftest sets
    TF_CPP_MIN_LOG_LEVEL)."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """A short Pong run, then `export` and `visualize` of it, in one new process (`_NOISY`):
    its exit code, the run, the two output directories, and `{command: (stdout,
    stderr)}`."""
    outdir = tmp_path_factory.mktemp("commands")
    logdir, model, videos = outdir / "pong", outdir / "model", outdir / "videos"
    result = subprocess.run(
        [sys.executable, "-c", _NOISY, HARMLESS, OTHER,
         "--config=pong", f"--logdir={logdir}", "--set", "steps=32", "--set", "num_agents=2",
         "--set", "rollout_length=8", "--set", "batch_size=8", "--set", "eval_every=32",
         "--set", "eval_episodes=0", "--",
         f"--logdir={logdir}", f"--outdir={model}", "--",
         f"--logdir={logdir}", f"--outdir={videos}", "--episodes=1", "--max-steps=40"],
        capture_output=True, text=True, timeout=300, env=_user_environment())
    stdout, stderr = (re.split(r"^=== (?:export|visualize)\n", text, flags=re.MULTILINE)
                      for text in (result.stdout, result.stderr))
    assert len(stdout) == len(stderr) == 3, result.stderr
    output = {"train": (stdout[0], stderr[0]), "export": (stdout[1], stderr[1]),
              "visualize": (stdout[2], stderr[2])}
    return result.returncode, logdir, model, videos, output


@pytest.fixture(scope="module")
def pong_run(commands):
    _, logdir, _, _, output = commands
    stdout, stderr = output["train"]
    assert stdout.strip().splitlines()[-1] == "train exit 0", stdout + stderr
    assert "oneDNN supports DT_UINT8" not in stderr  # A harmless line, dropped.
    return logdir


def test_export_takes_the_spaces_from_envpool_and_serves_the_restored_policy(
        pong_run, commands):
    code, _, outdir, _, output = commands
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


def test_visualize_shows_the_observations_enlarged(pong_run, commands):
    code, _, _, outdir, output = commands
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

"""`train`, `export` and `visualize` on the Dict-action task `reach_and_choose` (a `Box` and a
`Discrete` action leaf, a `Dict` observation with a `Discrete` leaf), in worker processes.
The commands run in this process (their `main`); the exported model is served in a new
process, without batchrl."""

import contextlib
import io
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

from batchrl.scripts import export, train, visualize

SHORT = ["--set", "steps=6000", "--set", "env_backend=processes", "--set", "num_workers=2"]
_SERVE = """
import sys
import numpy as np
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
data = np.load(sys.argv[2])
inputs = {key: tf.constant(data[key]) for key in data.files}
mean = model.signatures["serving_default"](**inputs)
sampled = model.signatures["sample"](**inputs)
assert "batchrl" not in sys.modules
np.savez(sys.argv[3], **{key: value.numpy() for key, value in mean.items()},
         **{"sampled_" + key: value.numpy() for key, value in sampled.items()})
"""


def _serve(*args):
    """Runs `_SERVE` with `args` in a new Python process."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", _SERVE, *args], capture_output=True,
                          text=True, timeout=600, env=env)


def _main(program, *args):
    """`program.main(args)` (a module of `batchrl.scripts`); returns its exit code and what
    it printed."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = program.main(list(args))
    return code, output.getvalue()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("nested") / "run"
    code, output = _main(train, "--config=reach_and_choose", f"--logdir={logdir}", *SHORT)
    assert code == 0, output
    return logdir, output


def test_the_dict_action_task_learns_both_leaves(run_dir):
    _, output = run_dir
    final = float(output.split("Final eval mean_score ")[1].split()[0])
    # The untrained mode (no move, one fixed kind) scores about -20 per episode; a right
    # kind adds 1 per step, a move error costs its mean square.
    assert final > 0, output


def test_export_serves_nested_observations_and_actions(run_dir, tmp_path):
    logdir, _ = run_dir
    code, output = _main(export, f"--logdir={logdir}", f"--outdir={tmp_path / 'model'}")
    assert code == 0 and output.startswith("Exported the policy of"), output
    random = np.random.default_rng(0)
    cue = random.integers(0, 3, 200)
    target = random.uniform(-1, 1, (200, 2)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", observation_cue=cue, observation_target=target)
    result = _serve(str(tmp_path / "model"), str(tmp_path / "inputs.npz"),
                    str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr[-3000:]
    served = dict(np.load(tmp_path / "out.npz"))
    assert sorted(served) == ["action_kind", "action_move", "sampled_action_kind",
                              "sampled_action_move"]
    kind, move = served["action_kind"], served["action_move"]
    assert kind.dtype == np.int32 and kind.shape == (200,) and set(kind) <= {1, 2, 3}
    assert move.dtype == np.float32 and move.shape == (200, 2) and np.abs(move).max() <= 2
    # After 6 updates the policy chooses the cued kind (cue + 1) more often than by chance
    # (1/3; 0.6 measured) and moves towards 2 x the target (its mean squared error 0.54,
    # against 1.30 for no move).
    assert np.mean(kind == cue + 1) > 0.5
    assert np.mean((move - 2 * target) ** 2) < 0.75 * np.mean((2 * target) ** 2)
    assert not np.allclose(served["sampled_action_move"], move)


def test_visualize_plays_the_nested_policy(run_dir, tmp_path):
    logdir, _ = run_dir
    code, output = _main(visualize, f"--logdir={logdir}", f"--outdir={tmp_path}",
                         "--max-steps=5")
    assert code == 0, output
    records = json.loads((tmp_path / "returns.json").read_text())
    assert len(records) == 1 and records[0]["length"] == 5
    with imageio.get_reader(tmp_path / "episode-000.mp4") as reader:
        frames = [frame for frame in reader]
    # ReachAndChoose renders 64 x 64 pixels; the video repeats each 3 x 3 times.
    assert len(frames) == 5 and frames[0].shape == (192, 192, 3)


def test_a_network_that_does_not_fit_the_actions_is_a_one_line_error(tmp_path, capsys):
    assert train.main(["--config=reach_and_choose", f"--logdir={tmp_path / 'run'}",
                       "--set", "network=feed_forward_gaussian"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert "Dict('kind'" in stderr and "use feed_forward_composite" in stderr
    assert not (tmp_path / "run").exists()

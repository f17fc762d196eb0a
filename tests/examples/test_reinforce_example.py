"""The "Write your own algorithm" listing of docs/algorithms.md is `examples/reinforce.py`, and
it trains through `train`."""

import pathlib
import runpy
import sys

import pytest

from batchrl.scripts.events import read_scalars

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "reinforce.py"


def test_docs_show_the_example_script():
    code = SCRIPT.read_text()
    body = code[code.index("import pathlib"):]
    assert f"```python\n{body}```" in (ROOT / "docs" / "algorithms.md").read_text()


def test_the_algorithm_is_at_most_40_lines_of_functions():
    code = SCRIPT.read_text()
    functions = code[code.index("\ndef "):code.index('if __name__ == "__main__":')]
    lines = [line for line in functions.splitlines() if line.strip()]
    assert len(lines) <= 40, len(lines)


def test_the_script_trains_cartpole_through_train(tmp_path, monkeypatch, capsys):
    """Run as a program (in this process, so that TensorFlow starts once): two short train
    phases with an update each, the loss summarized, checkpoints written."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # As `python examples/reinforce.py`.
    sets = ["steps=600", "eval_every=300", "eval_episodes=2", "num_agents=4",
            "update_every=4", "max_length=100"]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), f"--logdir={tmp_path}", "--no-progress",
                                      *[item for pair in sets for item in ("--set", pair)]])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exit_info.value.code == 0
    output = capsys.readouterr().out
    assert "with reinforce:REINFORCE (config '" in output
    assert "Final eval mean_score" in output
    assert (tmp_path / "ckpt-600.index").exists()
    assert len(read_scalars(tmp_path / "train", "reinforce/policy/loss")) >= 2

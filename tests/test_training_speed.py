"""scripts/training_speed.py: paired training speed of config variants."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import training_speed  # noqa: E402


def test_report_gives_each_variant_its_median_ratio_to_the_baseline_of_its_round():
    rounds = [[100.0, 150.0], [200.0, 260.0], [100.0, 120.0]]
    table = training_speed.report("cheetah", ["a", "b"], rounds, 1000, 1)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()
            if line.startswith("| a") or line.startswith("| b")}
    # Ratios per round 1.5, 1.3, 1.2: median 1.30 (the ratio of the medians would be 1.5).
    assert "1.30× (1.20–1.50)" in rows["b"]
    assert "| 150 / 260 / 120 | 150 |" in rows["b"]
    assert "1.00× (1.00–1.00)" in rows["a"]


def test_variants_are_split_like_a_shell():
    assert training_speed.parse_variant('env=HalfCheetah-v5 env_kwargs="{a: 1}"') == [
        "env=HalfCheetah-v5", "env_kwargs={a: 1}"]
    assert training_speed.parse_variant("") == []


TINY = ["num_agents=2", "update_every=2", "update_epochs=1", "max_length=50",
        "log_every=100", "env_backend=local"]


def test_two_variants_of_a_short_run_are_timed(tmp_path, capsys):
    output = tmp_path / "speed.md"
    argv = ["--config=pendulum", "--steps=400", "--rounds=1", "--variant", "",
            "--variant", "steps_per_call=1", f"--output={output}"]
    for item in TINY:
        argv += ["--set", item]
    assert training_speed.main(argv) == 0
    table = output.read_text()
    assert "| (the config) |" in table and "| steps_per_call=1 |" in table
    assert "round 1/1: (the config): " in capsys.readouterr().out


def test_a_failing_variant_names_its_overrides():
    with pytest.raises(RuntimeError, match="num_agents=0"):
        training_speed.train_rate("pendulum", ["num_agents=0"], 100, "/tmp/never-written")

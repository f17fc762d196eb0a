"""`python -m benchmarks.speed` (benchmarks/speed.py): the time of one update under variants
(`update`), and the paired training speed of config variants (`training`)."""

import pytest

from benchmarks import speed


def test_report_gives_each_variant_its_median_ratio_to_the_baseline_of_its_round():
    rounds = [[100.0, 150.0], [200.0, 260.0], [100.0, 120.0]]
    table = speed.report("cheetah", ["a", "b"], rounds, 1000, 1)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()
            if line.startswith("| a") or line.startswith("| b")}
    # Ratios per round 1.5, 1.3, 1.2: median 1.30 (the ratio of the medians would be 1.5).
    assert "1.30× (1.20–1.50)" in rows["b"]
    assert "| 150 / 260 / 120 | 150 |" in rows["b"]
    assert "1.00× (1.00–1.00)" in rows["a"]


def test_variants_are_split_like_a_shell():
    assert speed.parse_variant('env=HalfCheetah-v5 env_kwargs="{a: 1}"') == [
        "env=HalfCheetah-v5", "env_kwargs={a: 1}"]
    assert speed.parse_variant("") == []


TINY = ["num_agents=2", "update_every=2", "update_epochs=1", "max_length=50",
        "log_every=100", "env_backend=local"]


def test_a_short_run_of_a_variant_is_timed(tmp_path, capsys):
    """One variant, one round: a training process timed from its event files. More
    variants and rounds run the same loop; their report is checked above."""
    output = tmp_path / "speed.md"
    argv = ["--config=pendulum", "--steps=400", "--rounds=1", "--variant", "",
            f"--output={output}"]
    for item in TINY:
        argv += ["--set", item]
    assert speed.main(["training", *argv]) == 0
    table = output.read_text()
    row, = (line for line in table.splitlines() if line.startswith("| (the config) |"))
    rate = float(row.split(" | ")[1].replace(",", ""))
    assert rate > 0 and row.endswith(" | 1.00× (1.00–1.00) |")
    assert f"round 1/1: (the config): {rate:,.0f} steps/s" in capsys.readouterr().out


def test_a_failing_variant_names_its_overrides():
    with pytest.raises(RuntimeError, match="num_agents=0"):
        speed.train_rate("pendulum", ["num_agents=0"], 100, "/tmp/never-written")


def test_update_times_the_update_of_each_variant(capsys):
    """Two variants of a tiny pendulum agent: both report an update of 2 epochs x 1
    full-batch step, timed."""
    assert speed.parse_variant(" a=1  b=2 ") == ["a=1", "b=2"]
    code = speed.main([
        "update", "--config", "pendulum", "--set", "num_agents=2", "--set", "update_every=2",
        "--set", "update_epochs=2", "--set", "batch_size=null", "--set", "max_length=20",
        "--set", "policy_layers=[8]", "--set", "value_layers=[8]", "--repeats", "1",
        "--variant", "update_epochs=2", "--variant", "update_epochs=3"])
    assert code == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("update_epochs=")]
    assert [row[4] for row in rows] == ["2", "3"]  # Adam steps per update.
    assert float(rows[0][5]) == 1.0 and float(rows[1][2]) > 0
    assert speed.main(["update", "--variant", "no_such_key=1"]) == 2

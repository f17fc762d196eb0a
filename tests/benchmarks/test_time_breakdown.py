"""`python -m benchmarks.throughput breakdown` (benchmarks/throughput/breakdown.py) and the
docs/performance.md section it shares with the rest of the throughput suite (its report:
benchmarks/throughput/report.py)."""

import pytest

from batchrl import configs
from benchmarks.throughput import __main__ as throughput
from benchmarks.throughput import breakdown as time_breakdown
from benchmarks.throughput import report as throughput_report


def _call(seconds, count, log=False, updated=False):
    return (seconds, count, log, updated)


def test_split_attributes_the_calls_to_their_categories():
    """10 ms per 10-step call; updates add 100 ms (the first, compiled, 1 s more); a logged
    call 5 ms; the 0-step first call is tracing; the eval phases' first call is typical."""
    config = configs.load("default", {"steps_per_call": 10, "jit_update": True})
    train = [_call(2.0, 0)] + [_call(0.01, 10)] * 6 + [
        _call(1.11, 10, updated=True), _call(0.11, 10, updated=True),
        _call(0.11, 10, updated=True), _call(0.015, 10, log=True)]
    evals = [_call(0.01, 10)] * 4
    results = [type("Phase", (), {"name": "eval", "seconds": 0.5})()]
    marks = {"process": 100.0, "loop": 103.0}
    seconds = time_breakdown._split(marks, {"train": train, "eval": evals}, [0.2, 0.3],
                                    results, config)
    assert seconds["start-up"] == pytest.approx(3.0)
    assert seconds["tracing"] == pytest.approx(2.0)
    assert seconds["update compilation"] == pytest.approx(1.0)
    assert seconds["updates"] == pytest.approx(0.3)
    assert seconds["summaries"] == pytest.approx(0.005)
    assert seconds["acting and recording"] == pytest.approx(0.1)  # 100 steps at 1 ms.
    assert seconds["evaluation"] == pytest.approx(0.5)
    assert seconds["checkpoints"] == pytest.approx(0.5)


def test_split_takes_eval_calls_as_baseline_when_every_train_call_updates():
    config = configs.load("default", {"steps_per_call": 10})
    train = [_call(1.0, 0)] + [_call(0.25, 10, updated=True)] * 4
    evals = [_call(0.05, 10)] * 3
    seconds = time_breakdown._split({"process": 0.0, "loop": 1.0},
                                    {"train": train, "eval": evals}, [], [], config)
    assert seconds["updates"] == pytest.approx(0.8)
    assert seconds["acting and recording"] == pytest.approx(0.2)


def test_section_is_replaced_and_kept_by_the_throughput_report(tmp_path, monkeypatch):
    path = tmp_path / "performance.md"
    run = {"config": "pendulum", "steps": 1000, "total": 10.0, "to_first_step": 3.0,
           "updates": 2, "final_eval": -900.0, "date": "2026-11-23", "commit": "abc",
           "machine": "2 CPUs", "seconds": {key: 1.0 for key in time_breakdown.CATEGORIES}}
    time_breakdown.write_section(path, time_breakdown.markdown({"before": [run]}))
    assert "### before" in path.read_text() and "| start-up | 1.00 (10%) |" in path.read_text()
    monkeypatch.setattr(throughput_report, "markdown", lambda report: "# Throughput\n")
    throughput_report.write_markdown({}, path)
    text = path.read_text()
    assert text.startswith("# Throughput\n") and "### before" in text
    time_breakdown.write_section(path, time_breakdown.markdown({"after": [run]}))
    text = path.read_text()
    assert text.startswith("# Throughput\n") and "### after" in text
    assert "### before" not in text and text.count(time_breakdown.BEGIN) == 1



def test_breakdown_is_a_part_of_the_throughput_program(capsys):
    """`python -m benchmarks.throughput breakdown --help` reaches the breakdown's options."""
    with pytest.raises(SystemExit) as exit_info:
        throughput.main(["breakdown", "--help"])
    assert exit_info.value.code == 0
    output = capsys.readouterr().out
    assert "benchmarks.throughput breakdown" in output and "--report-only" in output

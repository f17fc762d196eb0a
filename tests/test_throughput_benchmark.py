"""`python -m benchmarks.throughput` (its parts, benchmarks/throughput/*.py) in quick mode
on Pendulum (Gymnasium's, the in-graph one and EnvPool's) with 2 environments.

No timing assertions (the machine may be busy): every measurement runs, reports a positive
rate, closes its worker processes, and the JSON and Markdown reports hold every row.
"""

import json
import multiprocessing
import os

import pytest

from benchmarks.throughput import baselines, settings, simulate
from benchmarks.throughput import command as benchmark
from benchmarks.throughput import report as report_lib

ENV = "Pendulum-v1"
NATIVE = "batchrl.envs:Pendulum"
SIZE = 2
ENVPOOL = "envpool:Pendulum-v1"
NATIVE_KINDS = {"single_env", "simulate_mock_loop", "ppo_inference", "ppo_training"}
ENVPOOL_KINDS = NATIVE_KINDS | {"batch_env"}
TIMING = dict(seconds=0.2, warmup=0.05)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """Runs the command in quick mode; returns `(report, markdown text)`."""
    out = tmp_path_factory.mktemp("bench")
    json_path, markdown_path = out / "performance.json", out / "performance.md"
    code = benchmark.main([
        "--quick", "--envs", ENV, NATIVE, ENVPOOL, "--sizes", str(SIZE),
        "--native-sizes", str(SIZE),
        "--steps-per-call", "3", "--seconds", str(TIMING["seconds"]),
        "--warmup", str(TIMING["warmup"]), "--json", str(json_path),
        "--output", str(markdown_path)])
    assert code == 0
    return json.loads(json_path.read_text()), markdown_path.read_text()


def test_every_measurement_reports_positive_rate(quick_run):
    report, _ = quick_run
    rows = {(row["env"], row["kind"], row["num_envs"]): row for row in report["rows"]}
    cores = os.cpu_count()
    single = {"single_env", "single_env_per_core"}
    expected = {(env, "single_env", 1) for env in (ENV, NATIVE, ENVPOOL)} | {
        (env, "single_env_per_core", cores) for env in (ENV, NATIVE, ENVPOOL)} | {
        (ENV, kind, SIZE) for kind in settings.KINDS if kind not in single} | {
        (NATIVE, kind, SIZE) for kind in NATIVE_KINDS - single} | {
        (ENVPOOL, kind, SIZE) for kind in ENVPOOL_KINDS - single}
    assert set(rows) == expected
    for key, row in rows.items():
        assert row["steps"] > 0 and row["seconds"] > 0, key
        assert row["steps_per_second"] > 0, key
        assert row["vs_single_env"] > 0 and row["vs_core_limit"] > 0, key
        if row["baseline"] is not None and row["env"] == ENV:  # All measured for ENV.
            assert row["vs_baseline"] > 0, key
    # simulate on EnvPool against EnvPool's own stepping.
    assert rows[ENVPOOL, "simulate_mock_loop", SIZE]["vs_baseline"] > 0
    assert rows[ENV, "ppo_training", SIZE]["updates"] is not None
    # K steps per call: every call of a K-step kind counts K batch steps.
    loop = rows[ENV, "simulate_mock_loop", SIZE]
    assert loop["steps"] == loop["calls"] * SIZE * 3
    # One loop per core: every process stepped (single_env steps 32 at a time).
    per_core = rows[ENV, "single_env_per_core", cores]
    assert per_core["steps"] >= per_core["calls"] * cores * baselines.SINGLE_ENV_CHUNK


def test_report_holds_machine_command_and_every_row(quick_run):
    report, text = quick_run
    machine = report["machine"]
    assert machine["cpu_count"] >= 1
    assert machine["python"] and machine["tensorflow"]
    assert report["date"] and "--quick" in report["command"]
    assert " -m benchmarks.throughput --quick " in report["command"]
    assert report["settings"]["quick"] is True
    assert report["core_limit"][ENV] > 0
    assert report["command"] in text and report["date"] in text
    assert f"{machine['cpu_count']}-core limit" in text
    # Measured at the start and at the end: a share of the cores, not a count of its own.
    assert len(machine["effective_cores"]) == 2
    assert all(0 < cores < 1.5 * machine["cpu_count"] for cores in machine["effective_cores"])
    assert "Effective cores: " in text
    # Quick mode measures no goal's row and runs no learning run: all unmeasured.
    assert [goal["met"] for goal in report["goals"]] == [None] * len(settings.GOALS)
    assert report["learning"] == []
    assert "## Goals" in text and text.count("| not measured | – |") == len(settings.GOALS)
    for row in report["rows"]:
        rate = f"{row['steps_per_second']:,.0f}"
        assert f"| {row['num_envs']} | `{row['kind']}` | {rate} | – |" in text


def test_no_worker_process_is_left(quick_run):
    assert multiprocessing.active_children() == []


def test_training_counts_updates_in_the_window():
    # A short schedule (an update after 2 episodes) so that the window holds an update.
    measurement = simulate.measure_ppo_training(
        ENV, SIZE, 1, min_updates=1, max_seconds=30.0,
        overrides={"update_every": 2, "update_epochs": 1}, **TIMING)
    assert measurement.kind == "ppo_training"
    assert measurement.updates >= 1
    assert measurement.steps_per_second > 0
    assert measurement.steps == measurement.calls * SIZE


def test_build_report_ratios():
    rows = [
        baselines.Measurement("single_env", ENV, 1, 1000, 1.0, 10, 0.0),
        baselines.Measurement("batch_env", ENV, 4, 3000, 1.0, 750, 0.0),
        baselines.Measurement("simulate_mock", ENV, 4, 1500, 1.0, 375, 0.0),
    ]
    machine = {"cpu_count": 2, "cpu": "test", "platform": "test", "python": "3.11",
               "tensorflow": "2.21", "gymnasium": "1.4", "mujoco": "4.0", "numpy": "2.4"}
    report = report_lib.build_report(rows, {"seconds": 1.0, "warmup": 0.1, "min_updates": 1},
                                     "cmd", machine=machine, date="today")
    by_kind = {row["kind"]: row for row in report["rows"]}
    assert by_kind["batch_env"]["vs_single_env"] == pytest.approx(3.0)
    assert by_kind["batch_env"]["vs_core_limit"] == pytest.approx(1.5)
    assert by_kind["batch_env"]["vs_baseline"] is None  # SyncVectorEnv was not measured.
    assert by_kind["simulate_mock"]["baseline"] == "batch_env"
    assert by_kind["simulate_mock"]["vs_baseline"] == pytest.approx(0.5)
    assert "| 4 | `simulate_mock` | 1,500 | – | 1.50× | 0.75× | 0.50× `batch_env` |" in (
        report_lib.markdown(report))


def test_repeats_report_the_median_and_the_range(monkeypatch):
    # Fake measurements: every call of a kind returns the next of 300, 100, 200 steps/s.
    rates = {}

    def fake(kind):
        def measure(env_id, num_envs=1, *args, **kwargs):
            sequence = rates.setdefault((kind, num_envs), iter([300, 100, 200]))
            return baselines.Measurement(kind, env_id, num_envs, next(sequence), 1.0, 1, 0.0)
        return measure

    for module, name in ((baselines, "single_env"), (baselines, "single_env_per_core"),
                         (simulate, "simulate_mock"), (simulate, "ppo_inference"),
                         (simulate, "ppo_training")):
        monkeypatch.setattr(module, f"measure_{name}", fake(name))
    lines = []
    results = benchmark.run_benchmark([NATIVE], [], native_sizes=[SIZE], log=lines.append,
                                      repeats=3, **TIMING)
    assert len(lines) == 3 * len(results) == 3 * 5  # Every kind ran 3 times...
    assert len({(m.kind, m.num_envs) for m in results}) == len(results)  # ...once here.
    for measurement in results:
        assert measurement.samples == (300, 100, 200)  # In the order they ran.
        assert measurement.steps_per_second == 200  # The median.
    report = report_lib.build_report(results, {"seconds": 0.2, "warmup": 0.05,
                                               "min_updates": 1, "repeats": 3}, "cmd")
    assert "| 1 | `single_env` | 200 | 100–300 |" in report_lib.markdown(report)


def test_paired_ratio_takes_the_median_of_the_rounds():
    def measured(kind, samples):
        rate = sorted(samples)[(len(samples) - 1) // 2]
        return baselines.Measurement(kind, ENV, 4, int(rate), 1.0, 1, 0.0,
                                     samples=tuple(samples))

    # Round 2 ran while the machine was slow for both kinds: the per-round ratios are 0.9,
    # 0.9 and 0.8; the ratio of the medians (450 / 1000) would say 0.45.
    ours = measured("simulate_mock_loop", [900, 450, 800])
    theirs = measured("batch_env", [1000, 500, 1000])
    assert report_lib.paired_ratio(ours, theirs) == pytest.approx(0.9)
    unrepeated = baselines.Measurement("batch_env", ENV, 4, 2000, 1.0, 1, 0.0)
    assert report_lib.paired_ratio(ours, unrepeated) == pytest.approx(800 / 2000)
    assert report_lib.paired_ratio(ours, None) is None


def test_goals_are_checked_against_their_rows():
    rows = [{"env": "HalfCheetah-v5", "kind": "simulate_mock_processes", "num_envs": 32,
             "vs_baseline": 1.2}]
    pairs = [
        baselines.PairedMeasurement("simulate_mock_loop", "batch_env", "Pendulum-v1", 32,
                                    (0.7, 0.85, 0.9), 850.0, 1000.0, 0.0),
        baselines.PairedMeasurement("simulate_mock_processes", "single_env", "HalfCheetah-v5",
                                    32, (1.5, 1.6, 1.7), 1600.0, 1000.0, 0.0),
        baselines.PairedMeasurement("simulate_mock_loop", "batch_env", "envpool:HalfCheetah-v5",
                                    32, (0.8, 0.9, 0.95), 900.0, 1000.0, 0.0),
        baselines.PairedMeasurement("simulate_mock_loop", "single_env",
                                    "envpool:HalfCheetah-v5", 32, (2.0, 2.2, 2.6), 2200.0,
                                    1000.0, 0.0)]
    learning = [{"seconds_to_threshold": 50.0}, {"seconds_to_threshold": 130.0}]
    goals = report_lib.check_goals(rows, pairs, learning, cpu_count=2)
    assert [(goal["value"], goal["met"]) for goal in goals] == [
        (0.85, True), (1.2, False), (0.8, True), (0.9, True), (1.1, False), (None, None),
        (130.0, False)]
    # A seed that never reached the threshold fails the learning goal.
    never = report_lib.check_goals(rows, pairs, [{"seconds_to_threshold": None}], 2)[-1]
    assert never["value"] == float("inf") and never["met"] is False
    text = "\n".join(report_lib._goals_markdown(goals))
    assert "| 0.85× | yes |" in text and "| not measured | – |" in text
    assert "| 130 s (slowest seed) | **no** |" in text


def test_paired_measurement_alternates_windows():
    pair = simulate.measure_paired(ENV, SIZE, "simulate_mock_loop", "batch_env", 3,
                                   seconds=0.5, warmup=0.05, window=0.05)
    assert (pair.kind, pair.baseline, pair.env, pair.num_envs) == (
        "simulate_mock_loop", "batch_env", ENV, SIZE)
    assert len(pair.ratios) >= 2 and all(ratio > 0 for ratio in pair.ratios)
    assert pair.steps_per_second > 0 and pair.baseline_steps_per_second > 0
    assert multiprocessing.active_children() == []
    report = report_lib.build_report([], {"seconds": 0.2, "warmup": 0.05, "min_updates": 1},
                                     "cmd", pairs=[pair])
    assert report["pairs"][0]["ratio"] == pair.ratio
    assert "## Paired measurements" in report_lib.markdown(report)


def test_learning_run_reports_the_time_to_the_threshold(tmp_path):
    # A short run; every eval return is above -1e6, so the first eval reaches it.
    run = simulate.measure_learning(3, 2000, tmp_path, threshold=-1e6)
    assert run["seed"] == 3 and run["steps"] == 2000
    assert run["steps_to_threshold"] == 2000  # The first eval, after the first phase.
    assert 0 < run["training_seconds_to_threshold"] <= run["seconds_to_threshold"]
    assert run["seconds_to_threshold"] <= run["command_seconds"]
    assert run["final_return"] == run["best_return"] < 0  # Pendulum's returns are negative.
    assert (tmp_path / "seed-3" / "config.yaml").exists()
    unreachable = simulate.measure_learning(3, 2000, tmp_path, threshold=1.0)  # Resumes.
    assert unreachable["seconds_to_threshold"] is None
    assert unreachable["steps_to_threshold"] is None

"""`python -m benchmarks.throughput` (its parts, benchmarks/throughput/*.py) in quick mode
on Pendulum (Gymnasium's, the in-graph one and EnvPool's) with 2 environments.

No timing assertions (the machine may be busy): every measurement runs, reports a positive
rate, closes its worker processes, and the JSON and Markdown reports hold every row. Every
kind but `ppo_training` (measured on its own, with an update) is measured on Gymnasium's
Pendulum; the in-graph and the EnvPool Pendulum get the kinds whose code differs with the
environment (`OTHER_KINDS`). Which kinds `run_benchmark` runs for each environment, and in
which process, is checked with fake measurements.
"""

import inspect
import json
import multiprocessing
import os

import pytest

from benchmarks.throughput import baselines, settings, simulate
from benchmarks.throughput import command as benchmark
from benchmarks.throughput import report as report_lib

ENV = "Pendulum-v1"
NATIVE = "batchrl.native_tasks:Pendulum"
SIZE = 2
ENVPOOL = "envpool:Pendulum-v1"
NATIVE_KINDS = {"single_env", "single_env_per_core", "simulate_mock_loop", "ppo_inference",
                "ppo_training"}
ENVPOOL_KINDS = NATIVE_KINDS | {"batch_env"}
# The kinds measured on NATIVE and ENVPOOL: the single environment (their Gymnasium
# equivalent, alone and in a process per core), EnvPool's own batch stepping, and simulate
# on each (with XLA in a process of its own for the in-graph one). BatchPPO is built the
# same way for every environment: measured on ENV only.
OTHER_KINDS = ["single_env", "single_env_per_core", "batch_env", "simulate_mock_loop"]
# The kinds measured on ENV, all in this process (`--inter-op-threads 1`); `_isolated` runs
# the in-graph simulate_mock_loop of OTHER_KINDS.
ENV_KINDS = [kind for kind in settings.KINDS if kind != "ppo_training"]
TIMING = dict(seconds=0.2, warmup=0.05)


def _quick(out, envs, *options):
    """Runs the command in quick mode on `envs` into the folder `out`; returns `(report,
    markdown text)`."""
    json_path, markdown_path = out / "performance.json", out / "performance.md"
    code = benchmark.main([
        "--quick", "--envs", *envs, "--sizes", str(SIZE), "--native-sizes", str(SIZE),
        "--steps-per-call", "3", "--seconds", str(TIMING["seconds"]),
        "--warmup", str(TIMING["warmup"]), *options, "--json", str(json_path),
        "--output", str(markdown_path)])
    assert code == 0
    return json.loads(json_path.read_text()), markdown_path.read_text()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`ENV_KINDS` on ENV: `(report, markdown text)`."""
    return _quick(tmp_path_factory.mktemp("bench"), [ENV], "--inter-op-threads", "1",
                  "--kinds", *ENV_KINDS)


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """`OTHER_KINDS` on NATIVE and ENVPOOL: `(report, markdown text)`."""
    return _quick(tmp_path_factory.mktemp("bench"), [NATIVE, ENVPOOL], "--kinds", *OTHER_KINDS)


def test_every_measurement_reports_positive_rate(quick_run, other_run):
    rows = {(row["env"], row["kind"], row["num_envs"]): row
            for report, _ in (quick_run, other_run) for row in report["rows"]}
    cores = os.cpu_count()
    single = {"single_env": 1, "single_env_per_core": cores}
    expected = {(ENV, kind, single.get(kind, SIZE)) for kind in ENV_KINDS} | {
        (env, kind, single.get(kind, SIZE)) for env, kinds in (
            (NATIVE, NATIVE_KINDS), (ENVPOOL, ENVPOOL_KINDS)) for kind in kinds
        if kind in OTHER_KINDS}
    assert set(rows) == expected
    for key, row in rows.items():
        assert row["steps"] > 0 and row["seconds"] > 0, key
        assert row["steps_per_second"] > 0, key
        assert row["vs_single_env"] > 0 and row["vs_core_limit"] > 0, key
        if row["baseline"] is not None and row["env"] == ENV:  # All measured for ENV.
            assert row["vs_baseline"] > 0, key
    # simulate on EnvPool against EnvPool's own stepping.
    assert rows[ENVPOOL, "simulate_mock_loop", SIZE]["vs_baseline"] > 0
    # K steps per call: every call of a K-step kind counts K batch steps.
    for env in (ENV, NATIVE):
        loop = rows[env, "simulate_mock_loop", SIZE]
        assert loop["steps"] == loop["calls"] * SIZE * 3
    # One loop per core: every process stepped (single_env steps 32 at a time).
    for env in (ENV, NATIVE):
        per_core = rows[env, "single_env_per_core", cores]
        assert per_core["steps"] >= per_core["calls"] * cores * baselines.SINGLE_ENV_CHUNK


def test_report_holds_machine_command_and_every_row(quick_run, other_run):
    for (report, text), kinds in ((quick_run, ENV_KINDS), (other_run, OTHER_KINDS)):
        machine = report["machine"]
        assert machine["cpu_count"] >= 1
        assert machine["python"] and machine["tensorflow"]
        assert report["date"] and "--quick" in report["command"]
        assert " -m benchmarks.throughput --quick " in report["command"]
        assert report["settings"]["quick"] is True and report["settings"]["kinds"] == kinds
        assert report["command"] in text and report["date"] in text
        assert f"{machine['cpu_count']}-core limit" in text
        # Measured at the start and at the end: a share of the cores, not a count of its own.
        assert len(machine["effective_cores"]) == 2
        assert all(0 < cores < 1.5 * machine["cpu_count"]
                   for cores in machine["effective_cores"])
        assert "Effective cores: " in text
        # Quick mode measures no goal's row and runs no learning run: all unmeasured.
        assert [goal["met"] for goal in report["goals"]] == [None] * len(settings.GOALS)
        assert report["learning"] == []
        assert "## Goals" in text and text.count("| not measured | – |") == len(settings.GOALS)
        for row in report["rows"]:
            rate = f"{row['steps_per_second']:,.0f}"
            assert f"| {row['num_envs']} | `{row['kind']}` | {rate} | – |" in text
    assert quick_run[0]["core_limit"][ENV] > 0
    assert " --kinds " + " ".join(OTHER_KINDS) + " " in other_run[0]["command"]


def test_no_worker_process_is_left(quick_run, other_run):
    assert multiprocessing.active_children() == []


def test_training_counts_updates_in_the_window():
    # A short schedule (an update after 2 episodes of 10 steps) so that the window holds
    # an update.
    measurement = simulate.measure_ppo_training(
        ENV, SIZE, 1, min_updates=1, max_seconds=30.0,
        overrides={"update_every": 2, "update_epochs": 1, "max_length": 10}, **TIMING)
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


def test_every_kind_that_applies_runs_in_rounds_in_its_process(monkeypatch):
    """Fake measurements: every call of a kind returns the next of 300, 100, 200 steps/s;
    `_isolated` (a new process) runs them here and records them."""
    rates, isolated = {}, []

    def fake(real, kind_of):
        signature = inspect.signature(real)

        def measure(env_id, *args, **kwargs):
            signature.bind(env_id, *args, **kwargs)  # A call that fits `real`.
            num_envs, kind = (args[0], kind_of(*args[1:])) if args else (1, kind_of())
            sequence = rates.setdefault((env_id, kind, num_envs), iter([300, 100, 200]))
            return baselines.Measurement(kind, env_id, num_envs, next(sequence), 1.0, 1, 0.0)
        return measure

    def simulate_kind(processes, steps_per_call):
        if processes:
            return "simulate_mock_processes"
        return "simulate_mock" if steps_per_call == 1 else "simulate_mock_loop"

    fakes = {
        (baselines, "single_env"): lambda: "single_env",
        (baselines, "single_env_per_core"): lambda: "single_env_per_core",
        (baselines, "batch_env"): lambda kind: kind,
        (baselines, "gymnasium_vector"): lambda processes: (
            "async_vector_env" if processes else "sync_vector_env"),
        (simulate, "simulate_mock"): simulate_kind,
        (simulate, "ppo_inference"): lambda steps_per_call: "ppo_inference",
        (simulate, "ppo_training"): lambda steps_per_call: "ppo_training"}
    for (module, name), kind_of in fakes.items():
        real = getattr(module, f"measure_{name}")
        monkeypatch.setattr(module, f"measure_{name}", fake(real, kind_of))

    def in_a_new_process(measure, inter_op_threads, *args, **kwargs):
        measurement = measure(*args, **kwargs)
        isolated.append((measurement.env, measurement.kind, inter_op_threads))
        return measurement

    monkeypatch.setattr(benchmark, "_isolated", in_a_new_process)
    lines = []
    results = benchmark.run_benchmark([ENV, NATIVE, ENVPOOL], [SIZE], native_sizes=[SIZE],
                                      log=lines.append, repeats=3, steps_per_call=3,
                                      own_inter_op_threads=1, **TIMING)
    single = {"single_env", "single_env_per_core"}
    assert {(m.env, m.kind, m.num_envs) for m in results} == {
        (env, kind, 1 if kind in single else SIZE) for env, kinds in (
            (ENV, settings.KINDS), (NATIVE, NATIVE_KINDS), (ENVPOOL, ENVPOOL_KINDS))
        for kind in kinds}
    assert len(lines) == 3 * len(results) == 3 * (12 + 5 + 6)  # Every kind ran 3 times...
    assert len({(m.env, m.kind) for m in results}) == len(results)  # ...once here.
    for measurement in results:
        assert measurement.samples == (300, 100, 200)  # In the order they ran.
        assert measurement.steps_per_second == 200  # The median.
    # TensorFlow with other inter-op threads than this process's 1 (training's 0 for worker
    # processes and in-graph environments) needs a process of its own.
    assert sorted(isolated) == sorted(3 * [
        (ENV, "simulate_mock_processes", 0), (NATIVE, "simulate_mock_loop", 0),
        (NATIVE, "ppo_inference", 0), (NATIVE, "ppo_training", 0)])
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


# A tiny run of the learning config: one update after 400 steps, then one eval (without XLA:
# the compilation is not what is tested).
TINY_LEARNING = ["num_agents=2", "eval_every=400", "log_every=400", "eval_episodes=2",
                 "update_every=2", "update_epochs=1", "jit_step=false", "policy_layers=[8]",
                 "value_layers=[8]"]


def test_learning_run_reports_the_time_to_the_threshold(tmp_path):
    # Every eval return is above -1e6, so the first eval reaches it.
    run = simulate.measure_learning(3, 400, tmp_path, threshold=-1e6, overrides=TINY_LEARNING)
    assert run["seed"] == 3 and run["steps"] == 400
    assert run["steps_to_threshold"] == 400  # The first eval, after the first phase.
    assert 0 < run["training_seconds_to_threshold"] <= run["seconds_to_threshold"]
    assert run["seconds_to_threshold"] <= run["command_seconds"]
    assert run["final_return"] == run["best_return"] < 0  # Pendulum's returns are negative.
    saved = (tmp_path / "seed-3" / "config.yaml").read_text()
    assert "num_agents: 2" in saved and "jit_step: false" in saved  # The overrides applied.
    unreachable = simulate.time_to_threshold(tmp_path / "seed-3", 0.0, threshold=1.0)
    assert unreachable["seconds_to_threshold"] is None
    assert unreachable["training_seconds_to_threshold"] is None
    assert unreachable["steps_to_threshold"] is None
    assert unreachable["final_return"] == run["final_return"]

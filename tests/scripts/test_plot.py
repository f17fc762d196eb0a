"""batchrl-plot and batchrl-benchmark (batchrl/scripts/plot.py, benchmark.py,
run_summary.py) on small synthetic event files."""

import pathlib
import shutil
import time

import matplotlib.image
import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.scripts import benchmark as learning_benchmark
from batchrl.scripts import plot, run_summary
from batchrl.scripts.events import Scalar

EVAL_STEPS = [20000, 40000, 60000]
# Per seed: eval returns at EVAL_STEPS. With threshold -250, seed 0 reaches it at 60,000
# steps, seed 1 at 40,000, seed 2 never.
EVAL = {0: [-900.0, -300.0, -200.0], 1: [-800.0, -240.0, -150.0], 2: [-1000.0, -600.0, -260.0]}
TRAIN_STEPS = [10000, 20000, 30000, 40000, 50000, 60000]


def _write_run(path, seed, eval_values, train_values, steps=60000, training_seconds=None,
               phases=None):
    """A run directory with the given scores; `training_seconds`, when given, the eval's
    `time/training_seconds` (as the Loop writes it) at each eval step; `phases`, when given,
    a list of `(step, steps/s, seconds)`: a train phase's `time/train_steps_per_second` and
    `time/train_phase_seconds` (as the Loop writes them)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        configs.dump({"env": "Fake-v0", "seed": seed, "steps": steps}))
    for phase, step_list, values in (("eval", EVAL_STEPS, eval_values),
                                     ("train", TRAIN_STEPS, train_values)):
        writer = tf.summary.create_file_writer(str(path / phase))
        with writer.as_default():
            for index, (step, value) in enumerate(zip(step_list, values, strict=True)):
                tf.summary.scalar("mean_score", value, step=step)
                tf.summary.scalar("mean_length", 200.0, step=step)
                if phase == "eval" and training_seconds:
                    tf.summary.scalar("time/training_seconds", training_seconds[index],
                                      step=step)
            for end, speed, seconds in (phases or []) if phase == "train" else []:
                tf.summary.scalar("time/train_steps_per_second", speed, step=end)
                tf.summary.scalar("time/train_phase_seconds", seconds, step=end)
        writer.close()


def _train_values(seed):
    return [-1200.0 + 150.0 * i + 10.0 * seed for i in range(len(TRAIN_STEPS))]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """LOGDIR/fake/seed-{0,1,2} in the layout of learning_benchmark.py."""
    logdir = tmp_path_factory.mktemp("bench")
    launched = time.time() - 3.0  # Seed 0's eval at 60,000 steps: 3 s from the command.
    # Seed 0: 20,000 steps in 20 s, then (resumed) 40,000 in 20 s: 1,500 steps/s over the
    # run; seed 1: 60,000 steps in 3 phases of 10 s; seed 2: no speed (an older run).
    phases = {0: [(20000, 1000.0, 20.0), (40000, 2000.0, 10.0), (60000, 2000.0, 10.0)],
              1: [(20000, 2000.0, 10.0), (40000, 2000.0, 10.0), (60000, 2000.0, 10.0)]}
    for seed, values in EVAL.items():
        _write_run(logdir / "fake" / f"seed-{seed}", seed, values, _train_values(seed),
                   training_seconds=[2.5, 7.5, 12.5] if seed == 0 else None,
                   phases=phases.get(seed))
    # The launch times that batchrl-benchmark writes; train's printed text is not read.
    (logdir / "fake" / "seed-0" / run_summary.LOG_NAME).write_text(
        f"# launched at {launched - 100:.3f}\n"
        "Trained 20,000 steps at 9 steps/s (including updates).\n"
        f"# launched at {launched:.3f}\n")
    return logdir


def test_read_run_returns_the_written_scalars(bench):
    run = plot.read_run(bench / "fake" / "seed-1")
    assert run.config["env"] == "Fake-v0" and run.config["seed"] == 1
    np.testing.assert_array_equal(run.series["eval"].steps, EVAL_STEPS)
    np.testing.assert_array_equal(run.series["eval"].values, EVAL[1])
    np.testing.assert_array_equal(run.series["train"].steps, TRAIN_STEPS)
    np.testing.assert_array_equal(run.series["train"].values, _train_values(1))
    for series in run.series.values():
        assert np.all(series.seconds >= 0) and np.all(np.diff(series.seconds) >= 0)
        assert series.seconds[-1] < 60  # Written just now, within seconds.
    assert plot.read_run(bench / "fake" / "seed-1", tag="no_such_tag").series == {}


def test_runs_are_found_and_grouped_by_env_and_name(bench):
    runs = [plot.read_run(path) for path in plot.find_runs(bench)]
    assert [run.path.name for run in runs] == ["seed-0", "seed-1", "seed-2"]
    groups = plot.group_runs(runs)
    assert list(groups) == ["Fake-v0 (fake)"] and len(groups["Fake-v0 (fake)"]) == 3
    assert plot.group_name(pathlib.Path("runs/seeds/pendulum-seed-2")) == "pendulum"
    assert plot.group_name(pathlib.Path("runs/benchmark/cartpole/seed-0")) == "cartpole"
    assert plot.group_name(pathlib.Path("runs/p2")) == "p2"
    labelled = plot.load_groups([bench / "fake" / "seed-0", bench / "fake" / "seed-2"],
                                labels=["a", "b"])
    assert {label: len(runs) for label, runs in labelled.items()} == {"a": 1, "b": 1}


def test_aggregate_is_numpy_percentiles_over_seeds(bench):
    runs = plot.group_runs([plot.read_run(path) for path in plot.find_runs(bench)])
    series = [run.series["eval"] for run in runs["Fake-v0 (fake)"]]
    stats = plot.aggregate([s.steps for s in series], [s.values for s in series])
    np.testing.assert_array_equal(stats.grid, EVAL_STEPS)  # The same steps: no interpolation.
    values = np.array([EVAL[seed] for seed in sorted(EVAL)])
    np.testing.assert_allclose(stats.values, values)
    np.testing.assert_allclose(stats.median, np.median(values, axis=0))
    np.testing.assert_allclose(stats.low, np.percentile(values, 25, axis=0))
    np.testing.assert_allclose(stats.high, np.percentile(values, 75, axis=0))
    np.testing.assert_allclose(stats.median, [-900.0, -300.0, -200.0])


def test_aggregate_interpolates_onto_the_common_range():
    xs = [np.array([0.0, 10.0, 20.0, 30.0]), np.array([5.0, 15.0, 25.0, 35.0])]
    ys = [np.array([0.0, 1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0, 40.0])]
    stats = plot.aggregate(xs, ys)
    grid = np.array([5.0, 10.0, 15.0, 20.0, 25.0, 30.0])
    np.testing.assert_array_equal(stats.grid, grid)
    values = np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys, strict=True)])
    np.testing.assert_allclose(stats.values, values)
    np.testing.assert_allclose(stats.median, np.percentile(values, 50, axis=0))
    np.testing.assert_allclose(stats.low, np.percentile(values, 25, axis=0))
    many = plot.aggregate([np.arange(1000.0), np.arange(1000.0) + 0.5], [np.zeros(1000)] * 2,
                          max_points=50)
    np.testing.assert_allclose(many.grid, np.linspace(0.5, 999.0, 50))
    assert len(plot.aggregate([np.array([0.0, 1.0]), np.array([2.0, 3.0])],
                              [np.zeros(2)] * 2).grid) == 0


def test_resumed_runs_drop_orphans_and_pauses():
    # The first process wrote steps 10-30 but its last checkpoint was at step 20; the
    # resumed process writes 30 and 40 again.
    scalars = [Scalar(10, 100.0, 1.0), Scalar(20, 110.0, 2.0), Scalar(30, 120.0, 3.0),
               Scalar(30, 1000.0, 3.5), Scalar(40, 1010.0, 4.0)]
    kept = plot.drop_orphans(scalars[::-1])
    assert [(s.step, s.value) for s in kept] == [(10, 1.0), (20, 2.0), (30, 3.5), (40, 4.0)]
    # Two event files per process (train, eval) overlap; the pause 120 -> 995 is removed.
    segments = plot.merge_segments([(95.0, 120.0), (95.0, 118.0), (995.0, 1010.0),
                                    (995.5, 1005.0)])
    assert segments == [(95.0, 120.0), (995.0, 1010.0)]
    np.testing.assert_allclose(plot.active_seconds([100.0, 120.0, 1000.0, 1010.0], segments),
                               [5.0, 25.0, 30.0, 40.0])


def test_plot_writes_a_png(bench, tmp_path):
    output = tmp_path / "curves.png"
    assert plot.main([str(bench), "--output", str(output), "--title", "fake"]) == 0
    assert output.stat().st_size > 0
    image = matplotlib.image.imread(output)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert plot.main([str(tmp_path / "missing"), "--output", str(output)]) == 2


def test_train_speed_is_read_from_the_event_files(bench, tmp_path):
    # All phases' steps over all their seconds, not the mean of the phases' rates.
    assert run_summary.train_speed(bench / "fake" / "seed-0") == pytest.approx(1500.0)
    assert run_summary.train_speed(bench / "fake" / "seed-1") == pytest.approx(2000.0)
    assert run_summary.train_speed(bench / "fake" / "seed-2") is None
    assert not (bench / "fake" / "seed-1" / run_summary.LOG_NAME).exists()
    assert run_summary.train_speed(tmp_path / "missing") is None


def test_benchmark_helpers():
    assert learning_benchmark.parse_thresholds(["cartpole=475", "pendulum=-250"]) == {
        **learning_benchmark.DEFAULT_THRESHOLDS, "pendulum": -250.0, "cartpole": 475.0}
    assert run_summary.launch_times(
        "# launched at 12.5\n$ python\n# launched at 20.25\n") == [12.5, 20.25]
    with pytest.raises(ValueError, match="CONFIG=VALUE"):
        learning_benchmark.parse_thresholds(["cartpole"])
    assert learning_benchmark.env_threshold("CartPole-v1") == 475.0
    assert learning_benchmark.env_threshold("Fake-v0") is None
    assert learning_benchmark.env_threshold("envpool:CartPole-v1") == 475.0
    assert learning_benchmark.env_threshold("envpool:CheetahRun-v1") is None


def test_checkpoint_step_and_discover(bench, tmp_path):
    run = tmp_path / "pendulum" / "seed-0"
    (run / "eval").mkdir(parents=True)
    assert run_summary.checkpoint_step(run) == 0
    (run / "checkpoint").write_text('model_checkpoint_path: "ckpt-40000"\n'
                                    'all_model_checkpoint_paths: "ckpt-20000"\n')
    assert run_summary.checkpoint_step(run) == 40000
    (tmp_path / "cartpole" / "seed-3" / "train").mkdir(parents=True)
    (tmp_path / "notes" / "seed-1").mkdir(parents=True)  # Not a run: no train/ or eval/.
    found = run_summary.discover(tmp_path)
    assert found == {"cartpole": {3: tmp_path / "cartpole" / "seed-3"},
                     "pendulum": {0: run}}
    assert list(run_summary.discover(tmp_path, ["pendulum"])) == ["pendulum"]
    assert list(run_summary.discover(bench)["fake"]) == [0, 1, 2]


def test_report_table_holds_the_expected_numbers(bench, tmp_path):
    output = tmp_path / "docs" / "results.md"
    (bench / "fake" / learning_benchmark.NOTES_NAME).write_text("Seeds 0 and 1 ran at once.\n")
    code = learning_benchmark.main(["--report-only", "--logdir", str(bench), "--output",
                                    str(output), "--threshold", "fake=-250"])
    assert code == 0
    text = output.read_text()
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    # final step, final return, best return, steps to threshold, training seconds,
    # seconds from the command, hours, hours per 1M steps, steps/s
    assert rows["0"][:4] == ["60,000", "-200.0", "-200.0", "60,000"]
    assert rows["0"][8] == "1,500"  # From the event files (train.log says 9).
    assert rows["1"][8] == "2,000"  # From the event files, without a train.log.
    assert rows["1"][:4] == ["60,000", "-150.0", "-150.0", "40,000"]
    assert rows["2"][:6] == ["60,000", "-260.0", "-260.0", "not reached", "not reached",
                             "not reached"]
    assert rows["2"][8] == "—"
    # Median over seeds; "not reached" counts as infinitely many steps.
    assert rows["**median**"][:4] == ["60,000", "-200.0", "-200.0", "60,000"]
    # Seed 0 has its training seconds and its launch time; seed 1 neither (older runs):
    # active seconds since the event files were created, and no time from the command.
    assert rows["0"][4] == "12.5" and 3.0 <= float(rows["0"][5]) < 10.0
    assert 0 <= float(rows["1"][4]) < 60 and rows["1"][5] == "not reached"
    for seed in ("0", "1"):
        assert 0 <= float(rows[seed][6]) < 0.1
        assert float(rows[seed][7]) == pytest.approx(float(rows[seed][6]) / 0.06, rel=0.1)
    assert "## fake (Fake-v0)" in text and "threshold -250" in text
    assert "Seeds 0 and 1 ran at once." in text
    assert "![fake learning curves](fake.png)" in text
    image = matplotlib.image.imread(output.parent / "fake.png")
    assert image.shape[0] > 100


def _row(seed, seconds, tracing):
    return dict(seed=seed, final_step=60_000, final_return=-150.0, best_return=-150.0,
                total_hours=0.01, hours_per_million=0.1, steps_per_second=7000.0,
                steps_to_threshold=None if seconds is None else 20_000,
                seconds_to_threshold=seconds, command_seconds=seconds and seconds + 3,
                tracing_seconds=tracing, target_steps=None)


def test_time_targets_count_tracing_and_the_command():
    # pendulum_native: <= 4 s of training (tracing and compilation included) and <= 6 s from
    # the command on the median seed, <= 8 s from the command on every seed.
    def rows(*times):
        return [dict(_row(seed, seconds, 1.8), command_seconds=command)
                for seed, (seconds, command) in enumerate(times)]

    text = learning_benchmark.target_text("pendulum_native", rows((2.2, 4.5), (4.4, 6.7),
                                                                  (2.3, 4.6)))
    assert text == (
        "Target: ≤ 4 s of training to the threshold (median seed): met; ≤ 6 s from the "
        "command (median seed): met; ≤ 8 s from the command (every seed): met. Train "
        "steps/s, updates included (median seed): 7,000; the JAX peer's: about 45,000.")
    # The median seed over 4 s of training and over 6 s from the command; one seed over 8 s.
    slow = learning_benchmark.target_text("pendulum", rows((4.4, 6.7), (4.5, 8.2),
                                                           (3.2, 5.5)))
    assert slow.count("**not met**") == 3 and "within ≤ 40,000 steps (every seed): met" in slow
    # Most seeds never reached the threshold: no median, every check fails.
    lost = learning_benchmark.target_text("pendulum", rows((3.0, 5.0), (None, None),
                                                           (None, None)))
    assert lost.count("**not met**") == 4


def test_report_keeps_the_sections_of_configs_without_runs(bench, tmp_path):
    output = tmp_path / "results.md"
    output.write_text(
        "# Learning results\n\nWritten by `scripts/learning_benchmark.py` on 2026-11-20 10:00 "
        "UTC from the runs under `runs/benchmark` (vm).\n\nColumns.\n\n"
        "## ant (Ant-v5)\n\n3 seed(s).\n\n| seed | final |\n|---|---|\n| 0 | 1519 |\n\n"
        "## fake (Fake-v0)\n\nan old fake section\n")
    args = ["--report-only", "--logdir", str(bench), "--output", str(output)]
    assert learning_benchmark.main(args) == 0
    text = output.read_text()
    # fake has runs: rewritten; ant has none: kept, said so, in name order before fake.
    assert "an old fake section" not in text and "## fake (Fake-v0)" in text
    ant = text[text.index("## ant (Ant-v5)"):text.index("## fake")]
    assert "| 0 | 1519 |" in ant
    assert ant.count("Kept from the report written 2026-11-20 10:00 UTC") == 1
    assert learning_benchmark.main(args) == 0  # Kept again: the note is not repeated.
    assert output.read_text().count("Kept from the report written") == 1


def test_report_of_some_configs_keeps_the_others_with_runs_as_they_were(bench, tmp_path):
    # --report-only --configs ant: fake's runs exist but are left out, so its section is
    # kept without the note that its runs are gone.
    logdir = tmp_path / "runs"
    shutil.copytree(bench / "fake", logdir / "fake")
    output = tmp_path / "results.md"
    assert learning_benchmark.main(
        ["--report-only", "--logdir", str(logdir), "--output", str(output)]) == 0
    fake = output.read_text().split("## fake (Fake-v0)")[1]
    shutil.copytree(bench / "fake" / "seed-0", logdir / "ant" / "seed-0")
    assert learning_benchmark.main(["--report-only", "--configs", "ant", "--logdir",
                                    str(logdir), "--output", str(output)]) == 0
    text = output.read_text()
    assert "## ant (Fake-v0)" in text and "Kept from the report written" not in text
    assert text.split("## fake (Fake-v0)")[1] == fake


def test_report_opens_with_each_configs_first_hit_beside_its_final_eval(bench, tmp_path):
    # ant: a kept section with a one-seed table; cheetah_sac: a section written by hand;
    # fake: runs under LOGDIR; swimmer: only in an older report next to this one (its
    # table with other columns after the first five), pendulum_trpo: in an older and a newer
    # one; pong_dqn: a config under configs/ in no report.
    output = tmp_path / "results.md"
    output.write_text(
        "# Learning results\n\nWritten by `batchrl-benchmark` on 2026-11-20 10:00 UTC from "
        "the runs under `runs/benchmark` (vm).\n\n"
        "## ant (Ant-v5)\n\n1 seed(s) in `runs/benchmark/ant`; threshold 6000 (Gymnasium's "
        f"reward_threshold); overrides: none.\n\n{learning_benchmark.TABLE_HEADER}\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| 0 | 1,000,000 | 1518.9 | 1583.0 | not reached | not reached | not reached | 0.248 "
        "| 0.25 | 1,326 |\n\n"
        "## cheetah_sac (envpool:HalfCheetah-v5)\n\n| seed | eval at 100k |\n|---|---|\n"
        "| 0 | 5,591.0 |\n")

    def other(name, date, final):
        (tmp_path / "older").mkdir(exist_ok=True)
        (tmp_path / "older" / name).write_text(
            f"# Learning results of then\n\nWritten by `batchrl-benchmark` on {date} from "
            "the runs under `runs/old` (vm).\n\n"
            "## pendulum_trpo (Pendulum-v1)\n\n3 seed(s) in `runs/old/pendulum_trpo`; "
            "threshold -250; overrides: none.\n\n"
            "| seed | final step | final eval return | best eval return | steps to ≥ "
            "threshold | minutes to ≥ threshold |\n|---|---|---|---|---|---|\n"
            f"| **median** | 500,000 | {final} | -91.8 | 50,000 | 0.8 |\n\n"
            "## swimmer (Swimmer-v5)\n\n1 seed(s) in `runs/old/swimmer`; threshold 360 "
            "(Gymnasium's reward_threshold).\n\n"
            "| seed | final step | final eval return | best eval return | steps to ≥ "
            "threshold | minutes to ≥ threshold |\n|---|---|---|---|---|---|\n"
            "| 0 | 1,000,000 | 309.6 | 309.6 | not reached | not reached |\n")

    other("a.md", "2026-11-24 08:03 UTC", "-193.5")
    other("b.md", "2026-11-22 05:47 UTC", "-300.0")
    assert learning_benchmark.main(["--report-only", "--logdir", str(bench), "--output",
                                    str(output), "--threshold", "fake=-250"]) == 0
    text = output.read_text()
    summary = text.split("## First hit and final evaluation of every config")[1]
    summary = summary.split("\n## ")[0]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in summary.splitlines() if line.startswith("| `")}
    # fake, by hand from EVAL: first >= -250 at 60k, 40k, never (median 60k); final
    # returns -200, -150, -260 (median -200); best the same.
    assert rows["`fake`"] == ["Fake-v0", "3", "-250", "60,000", "60,000", "-200.0", "-200.0",
                              "below"]
    assert rows["`ant`"] == ["Ant-v5", "1", "6000", "not reached", "1,000,000", "1518.9",
                             "1583.0", "below"]
    assert rows["`pendulum_trpo`"] == [
        "Pendulum-v1", "3", "-250", "50,000", "500,000", "-193.5", "-91.8",
        "[older/a.md](older/a.md), 2026-11-24 08:03 UTC"]
    assert rows["`swimmer`"][1:7] == ["1", "360", "not reached", "1,000,000", "309.6",
                                      "309.6"]
    assert rows["`cheetah_sac`"][3] == rows["`cheetah_sac`"][5] == "see its section (by hand)"
    assert rows["`pong_dqn`"][3] == rows["`pong_dqn`"][5] == "not measured"
    assert {f"`{name}`" for name in configs.available()} <= set(rows)
    # The summary comes before the sections and is not taken for one when kept again.
    assert text.index("## First hit") < text.index("## ant (Ant-v5)")
    assert learning_benchmark.main(["--report-only", "--logdir", str(bench), "--output",
                                    str(output), "--threshold", "fake=-250"]) == 0
    assert output.read_text().count("## First hit") == 1


def test_cartpole_dqns_target_is_its_final_eval_not_its_first_hit():
    # The three seeds of the issue: each reached 500 within 50k steps, two ended below.
    def rows(*finals):
        return [dict(_row(seed, 20.0, 3.0), final_return=final, best_return=500.0,
                     steps_to_threshold=20_000) for seed, final in enumerate(finals)]

    assert learning_benchmark.target_text("cartpole_dqn", rows(67.9, 500.0, 84.1)) == (
        "Target: final eval return ≥ 475 (median seed): **not met**.")
    assert learning_benchmark.target_text("cartpole_dqn", rows(67.9, 500.0, 480.0)) == (
        "Target: final eval return ≥ 475 (median seed): met.")

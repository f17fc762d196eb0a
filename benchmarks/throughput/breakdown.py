"""Where the wall-clock time of a training run goes, written into docs/performance.md.

    .venv/bin/python -m benchmarks.throughput breakdown --configs pendulum pendulum_native \\
        cheetah --label after
    .venv/bin/python -m benchmarks.throughput breakdown --report-only

Each config trains for its `--steps` (default: a few updates' worth, see STEPS) in a fresh
process, as the training command does, with every phase timed from the moment that
process was started (so Python's and TensorFlow's start-up count). Like the command, it
loads XLA's programs from the persistent cache (`batchrl.scripts.compile_cache`) when they
are there: run it with `BATCHRL_XLA_CACHE=off` to time their compilation. The phases:

- start-up: imports (TensorFlow, Keras, Gymnasium), creating the environments, building
  the agent (networks, optimizers, variables) and the loop (summary writers, step
  functions), up to the first training call;
- tracing: what the first call of the train and of the eval step function takes beyond a
  later call of the same length (building and optimizing the graph);
- stepping: the environments and `simulate`'s bookkeeping, measured after training by
  running `simulate` with `MockAlgorithm` for as many batch steps in the same process;
- acting and recording: the rest of the train calls without an update (the policy's
  inference, the normalizers, the episode memory); where every train call holds an
  update, an eval call of the same length stands in for one without (so recording is
  then counted with the updates);
- updates: what the train calls with a PPO update take beyond a call without one (their
  summaries included); XLA compilation of the update (the first update's extra time over
  the later ones, with `jit_update`) is listed apart;
- summaries: the train calls that write the score summaries, beyond those that do not;
- evaluation: the eval phases after their first call (which counts as tracing);
- checkpoints: `CheckpointManager.save` and the writers' flushes;
- other: the Python loop, progress output and whatever is left.

Results are stored per `--label` (e.g. `before` at an older commit, `after`) in
docs/time_breakdown.json, and the section between the markers `<!-- time-breakdown -->`
and `<!-- /time-breakdown -->` of docs/performance.md is rewritten from all labels; the
rest of that file (written by `python -m benchmarks.throughput`, see `write_markdown` in
benchmarks/throughput/report.py) is kept.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

from benchmarks import child_environment, replace_marked

STEPS = {"pendulum": 40_000, "pendulum_native": 80_000, "cheetah": 50_000}
CATEGORIES = ("start-up", "tracing", "stepping", "acting and recording", "updates",
              "update compilation", "summaries", "evaluation", "checkpoints", "other")
BEGIN, END = "<!-- time-breakdown -->", "<!-- /time-breakdown -->"


class _TimedFunction:
    """Wraps the Loop's step function: records `(seconds, count, log, updated)` per call
    in `calls["train"]` or `calls["eval"]`, by the `is_training` variable."""

    def __init__(self, function, iterations, is_training, calls):
        self._function = function
        self._iterations = iterations
        self._is_training = is_training
        self.calls = calls

    def __call__(self, log, reset, count):
        before = int(self._iterations.numpy())
        start = time.perf_counter()
        done, score = self._function(log, reset, count)
        done.numpy()  # Waits for the call to finish.
        seconds = time.perf_counter() - start
        phase = "train" if bool(self._is_training.numpy()) else "eval"
        self.calls[phase].append((seconds, int(count.numpy()), bool(log.numpy()),
                                  int(self._iterations.numpy()) > before))
        return done, score

    def __getattr__(self, name):
        return getattr(self._function, name)


def _typical(calls, count):
    """Median seconds of the calls of `count` steps among `calls` (None when none)."""
    times = [seconds for seconds, steps, _, _ in calls if steps == count]
    return statistics.median(times) if times else None


def _stepping_seconds(config, batch_env, steps_per_call, calls):
    """Seconds that `simulate` with `MockAlgorithm` takes for the batch steps of `calls`."""
    import tensorflow as tf

    from batchrl.drivers.loop import step_function
    from batchrl.tools.mock_algorithm import MockAlgorithm

    mock = step_function(batch_env, MockAlgorithm(batch_env, seed=config.seed),
                         steps_per_call)
    mock(tf.constant(False), tf.constant(True), tf.constant(steps_per_call))  # Traces.
    per_call = []
    for _ in range(max(3, min(20, len(calls)))):
        start = time.perf_counter()
        done, _ = mock(tf.constant(False), tf.constant(False), tf.constant(steps_per_call))
        done.numpy()
        per_call.append(time.perf_counter() - start)
    per_step = statistics.median(per_call) / steps_per_call
    return per_step * sum(count for _, count, _, _ in calls)


def worker(config_name, steps, overrides, logdir):
    """Trains `config_name` in this process and returns the breakdown (dict of seconds)."""
    from batchrl.scripts.train import process_start_time

    marks = {"process": process_start_time()}
    from batchrl.scripts import train

    train.start_tensorflow(xla_cache=True)  # As the command; timed: part of start-up.
    from batchrl import build as build_lib
    from batchrl import configs, environments
    marks["imports"] = time.time()
    config = configs.load(config_name, [*overrides, f"steps={steps}"])
    train.check(config, logdir)
    train.write_run_config(logdir, config)
    train.configure_tensorflow(config)
    batch_env = environments.create_batch(config)
    marks["environments"] = time.time()
    agent = build_lib.build(config, batch_env)
    marks["agent"] = time.time()
    loop = train.make_loop(config, logdir, agent, progress=False)
    iterations = agent.algo.checkpoint_state["policy_optimizer"].iterations
    calls = _instrument(loop, iterations, agent.is_training)
    saves = []
    save = loop.save

    def timed_save():
        start = time.perf_counter()
        path = save()
        saves.append(time.perf_counter() - start)
        return path

    loop.save = timed_save
    marks["loop"] = time.time()
    try:
        results = loop.run()
        marks["trained"] = time.time()
        breakdown = _split(marks, calls, saves, results, config)
        breakdown["stepping"] = _stepping_seconds(
            config, agent.batch_env, config.steps_per_call, calls["train"])
    finally:
        batch_env.close()
    breakdown["acting and recording"] -= breakdown["stepping"]
    breakdown["other"] = (marks["trained"] - marks["process"]) - sum(
        value for key, value in breakdown.items() if key != "other")
    final = [result for result in results if result.name == "eval"]
    return {"config": config_name, "steps": config.steps, "seconds": breakdown,
            "total": marks["trained"] - marks["process"],
            "to_first_step": marks["loop"] - marks["process"],
            "final_eval": final[-1].mean_score if final else None,
            "updates": sum(updated for *_, updated in calls["train"])}


def _instrument(loop, iterations, is_training):
    """Times every call of the Loop's step function (one for both phases; in Loops before
    2026-11-23, one per phase); returns the records, `{"train": [...], "eval": [...]}`."""
    calls = {"train": [], "eval": []}
    if hasattr(loop, "_functions"):
        loop._functions = {name: _TimedFunction(function, iterations, is_training, calls)
                           for name, function in loop._functions.items()}
    else:
        loop._function = _TimedFunction(loop._function, iterations, is_training, calls)
    return calls


def _split(marks, calls, saves, results, config):
    """Seconds per category from the call records (stepping not yet separated)."""
    train_calls, eval_calls = calls["train"], calls["eval"]
    full = config.steps_per_call
    plain = [call for call in train_calls[1:] if not call[2] and not call[3]]
    logged = [call for call in train_calls[1:] if call[2] and not call[3]]
    updates = [call for call in train_calls[1:] if call[3]]
    # Where every train call holds an update (one update per call), the eval calls (acting
    # without recording) give the cost of a call without one.
    typical = (_typical(plain, full) or _typical(eval_calls[1:], full)
               or _typical(train_calls[1:], full))
    per_step = typical / full
    tracing = train_calls[0][0] - per_step * train_calls[0][1]
    seconds = {key: 0.0 for key in CATEGORIES}
    seconds["start-up"] = marks["loop"] - marks["process"]
    seconds["acting and recording"] = per_step * sum(count for _, count, _, _ in train_calls)
    update_extra = [s - per_step * count for s, count, _, _ in updates]
    if len(update_extra) > 1 and config.get("jit_update"):
        seconds["update compilation"] = max(
            0.0, update_extra[0] - statistics.median(update_extra[1:]))
        update_extra[0] -= seconds["update compilation"]
    seconds["updates"] = sum(update_extra)
    seconds["summaries"] = sum(max(0.0, s - per_step * count) for s, count, _, _ in logged)
    # The first eval call's extra time: tracing where the eval phase has a function of
    # its own (Loops before 2026-11-23), noise otherwise.
    eval_first = 0.0
    if eval_calls:
        eval_first = eval_calls[0][0] - (_typical(eval_calls[1:], full) or eval_calls[0][0])
    seconds["tracing"] = tracing + eval_first
    eval_seconds = sum(result.seconds for result in results if result.name == "eval")
    seconds["evaluation"] = eval_seconds - eval_first
    seconds["checkpoints"] = sum(saves)
    return seconds


def markdown(store):
    """The docs/performance.md section of all labels in `store` (dict label -> runs)."""
    lines = [BEGIN, "", "## Where the time of a training run goes", "",
             "Written by `python -m benchmarks.throughput breakdown` (its docstring, "
             "benchmarks/throughput/breakdown.py, defines each row). Seconds of wall-clock "
             "time from the start of the training process; each config trains the steps "
             "given, in a fresh process, with its shipped settings at the labelled commit.", ""]
    for label, runs in store.items():
        meta = runs[0]
        lines += [f"### {label}", "", f"{meta['date']}, commit `{meta['commit']}`, "
                  f"{meta['machine']}.", ""]
        header = "| | " + " | ".join(f"{run['config']} ({run['steps']:,} steps)"
                                      for run in runs) + " |"
        lines += [header, "|---" * (len(runs) + 1) + "|"]
        for key in CATEGORIES:
            cells = [f"{run['seconds'][key]:.2f} ({run['seconds'][key] / run['total']:.0%})"
                     for run in runs]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines.append("| **total** | " + " | ".join(f"**{run['total']:.2f}**" for run in runs)
                     + " |")
        lines.append("| to the first training call | " + " | ".join(
            f"{run['to_first_step']:.2f}" for run in runs) + " |")
        lines.append("| updates (PPO) | " + " | ".join(str(run["updates"]) for run in runs)
                     + " |")
        lines.append("| final eval return | " + " | ".join(
            "—" if run["final_eval"] is None else f"{run['final_eval']:.1f}"
            for run in runs) + " |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines) + "\n"


def read_section(path):
    """The marked section of `path` (markers included), or None."""
    path = pathlib.Path(path)
    text = path.read_text() if path.exists() else ""
    if BEGIN not in text or END not in text:
        return None
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END + "\n"


def write_section(path, section):
    """Replaces the marked section of `path` with `section` (appends it if missing)."""
    replace_marked(path, section, BEGIN, END)


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput breakdown",
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(STEPS),
                        help="config names (default: %(default)s)")
    parser.add_argument("--steps", type=int, help="training steps of every config "
                        f"(default: per config, {STEPS})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override config keys of every run (repeatable)")
    parser.add_argument("--label", default="after", help="the results' name in the report")
    parser.add_argument("--logdir", default="runs/time_breakdown",
                        help="run directories go to LOGDIR/LABEL/CONFIG (replaced)")
    parser.add_argument("--json", default="docs/time_breakdown.json",
                        help="stored results of every label (default: %(default)s)")
    parser.add_argument("--output", default="docs/performance.md",
                        help="the file whose section is rewritten (default: %(default)s)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the section from the stored results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        result = worker(args.worker, args.steps, args.set, args.logdir)
        pathlib.Path(args.result).write_text(json.dumps(result))
        return 0
    store_path = pathlib.Path(args.json)
    store = json.loads(store_path.read_text()) if store_path.exists() else {}
    if not args.report_only:
        runs = []
        for name in args.configs:
            runs.append(_run_worker(name, args, store_path.parent))
        store[args.label] = runs
        store_path.parent.mkdir(parents=True, exist_ok=True)
        store_path.write_text(json.dumps(store, indent=2) + "\n")
    write_section(args.output, markdown(store))
    print(markdown(store))
    return 0


def _run_worker(name, args, folder):
    """Runs one config's timed training in a fresh process; returns its result dict."""
    import shutil

    logdir = pathlib.Path(args.logdir) / args.label / name
    shutil.rmtree(logdir, ignore_errors=True)
    result_path = folder / f".time_breakdown_{name}.json"
    steps = args.steps or STEPS.get(name, 50_000)
    command = [sys.executable, "-m", "benchmarks.throughput", "breakdown", "--worker", name,
               "--steps", str(steps), "--logdir", str(logdir), "--result", str(result_path),
               *[item for pair in args.set for item in ("--set", pair)]]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=child_environment())
    result = json.loads(result_path.read_text())
    result_path.unlink()
    result.update(date=datetime.date.today().isoformat(), commit=_commit(),
                  machine=f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
    total = result["total"]
    print(f"{name}: {total:.1f} s; " + ", ".join(
        f"{key} {value:.2f}" for key, value in result["seconds"].items()), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())

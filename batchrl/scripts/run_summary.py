"""The runs of `batchrl-benchmark` and their rows: run directories LOGDIR/CONFIG/seed-N
found, and each summarized from its event files, checkpoint and train.log (the steps and
seconds to a threshold, the final and best returns, hours and steps/s), with the median
over seeds."""

import pathlib
import re

import numpy as np

from batchrl.scripts import plot
from batchrl.scripts.events import read_scalars

LOG_NAME = "train.log"  # RUN_DIR/train.log: the output of the run's training processes.


def run_dir(logdir, config, seed):
    return pathlib.Path(logdir) / config / f"seed-{seed}"


def discover(logdir, config_names=None, seeds=None):
    """Existing runs under `logdir`: dict config -> {seed: run directory}, sorted.

    Reads the layout LOGDIR/CONFIG/seed-N; `config_names` and `seeds` filter when given.
    """
    logdir = pathlib.Path(logdir)
    found = {}
    for path in logdir.glob("*/seed-*"):
        match = re.fullmatch(r"(?P<config>[^/]+)/seed-(?P<seed>\d+)",
                             path.relative_to(logdir).as_posix())
        if not match or not plot.is_run_dir(path):
            continue
        config, seed = match["config"], int(match["seed"])
        if config_names and config not in config_names or seeds and seed not in seeds:
            continue
        found.setdefault(config, {}).setdefault(seed, path)
    order = {name: index for index, name in enumerate(config_names or [])}
    return {config: dict(sorted(found[config].items()))
            for config in sorted(found, key=lambda name: (order.get(name, len(order)), name))}


def checkpoint_step(path):
    """The global step of a run directory's latest checkpoint (0 when there is none)."""
    try:
        text = (pathlib.Path(path) / "checkpoint").read_text()
    except FileNotFoundError:
        return 0
    match = re.search(r'^model_checkpoint_path:\s*".*?ckpt-(\d+)"', text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def launch_times(log_text):
    """The epoch seconds at which each training process of a run was launched, from the
    `# launched at SECONDS` lines that `train_run` writes into train.log."""
    return [float(value) for value in re.findall(r"^# launched at ([\d.]+)", log_text,
                                                 re.MULTILINE)]


def train_speed(path):
    """A run's training steps/s, updates included, from its event files (`path`/train).

    The Loop writes at the end of each train phase `time/train_steps_per_second` and
    `time/train_phase_seconds`; this is all phases' steps over all their seconds, those
    of every resumed process included (what `batchrl-train` prints as `Trained N steps at
    R steps/s`, over the whole run). None for a run without them (one written before the
    Loop wrote them, or without a finished train phase).
    """
    train = pathlib.Path(path) / "train"
    if not train.is_dir():
        return None
    speeds = read_scalars(train, "time/train_steps_per_second")
    seconds = read_scalars(train, "time/train_phase_seconds")
    if not speeds or len(speeds) != len(seconds):
        return None
    total = sum(phase.value for phase in seconds)
    steps = sum(speed.value * phase.value for speed, phase in zip(speeds, seconds, strict=True))
    return steps / total if total > 0 else None


def summarize(run, threshold=None):
    """One row of the table, from a `plot.Run` and its directory's checkpoint and train.log.

    Returns:
      dict with `seed`, `final_step` (the last step of the checkpoint or the events),
      `target_steps` (the config's `steps`, or None), `final_return`, `best_return` (None
      without eval scores), `steps_to_threshold`, `seconds_to_threshold` (training
      wall-clock: the eval's `time/training_seconds`, or for runs without it the active
      seconds since the event files were created) and `command_seconds` (from the launch
      of the training process to that eval, None without its launch time in train.log),
      each None when not reached or without threshold, `total_hours`, `hours_per_million`
      (total hours per 1M steps) and `steps_per_second` (`train_speed`).
    """
    scores = run.series.get("eval")
    row = {"seed": run.config.get("seed"), "target_steps": run.config.get("steps"),
           "final_step": None, "final_return": None, "best_return": None,
           "steps_to_threshold": None, "seconds_to_threshold": None,
           "tracing_seconds": None, "command_seconds": None,
           "total_hours": run.total_seconds / 3600, "hours_per_million": None,
           "steps_per_second": None}
    log = run.path / LOG_NAME
    log_text = log.read_text(errors="replace") if log.exists() else ""
    if scores is not None:
        row.update(final_step=int(scores.steps[-1]), final_return=float(scores.values[-1]),
                   best_return=float(scores.values.max()))
        if threshold is not None:
            reached = np.flatnonzero(scores.values >= threshold)
            if len(reached):
                step = int(scores.steps[reached[0]])
                row.update(steps_to_threshold=step,
                           seconds_to_threshold=float(scores.seconds[reached[0]]))
                row.update(_times_at(run.path, step, launch_times(log_text)))
    last_steps = [int(series.steps[-1]) for series in run.series.values()]
    row["final_step"] = max([checkpoint_step(run.path), *last_steps]) or None
    if row["final_step"]:
        row["hours_per_million"] = row["total_hours"] / row["final_step"] * 1e6
    row["steps_per_second"] = train_speed(run.path)
    return row


def _times_at(path, step, launches):
    """`seconds_to_threshold`, `tracing_seconds` (of it, building the step function) and
    `command_seconds` of the eval at `step`, where the run's event files have them
    (`time/training_seconds`, `time/tracing_seconds`; the process's launch)."""
    times = {}
    training = [s for s in read_scalars(path / "eval", "time/training_seconds")
                if s.step == step]
    if training:
        times["seconds_to_threshold"] = training[-1].value
    tracing = [s for s in read_scalars(path / "eval", "time/tracing_seconds")
               if s.step == step]
    if tracing:
        times["tracing_seconds"] = tracing[-1].value
    scores = [s for s in read_scalars(path / "eval", "mean_score") if s.step == step]
    earlier = [launch for launch in launches if scores and launch <= scores[-1].wall_time]
    if earlier:
        times["command_seconds"] = scores[-1].wall_time - max(earlier)
    return times


def _median(values):
    values = [value for value in values if value is not None]
    return float(np.median(values)) if values else None


def _median_reached(values, rows):
    """The median of one column over the rows that have a final return, None (the
    threshold not reached) counting as infinite."""
    values = [np.inf if value is None else value
              for value, row in zip(values, rows, strict=True) if row["final_return"] is not None]
    value = float(np.median(values)) if values else None
    return None if value is None or np.isinf(value) else value


def median_row(rows):
    """The median over seeds of each column; a threshold not reached counts as infinite,
    so the median is "not reached" when at most half of the seeds reached it."""
    median = {"seed": "median"}
    for key in ("final_step", "final_return", "best_return", "total_hours",
                "hours_per_million", "steps_per_second"):
        median[key] = _median([row[key] for row in rows])
    median["tracing_seconds"] = _median([row.get("tracing_seconds") for row in rows])
    for key in ("steps_to_threshold", "seconds_to_threshold", "command_seconds"):
        median[key] = _median_reached([row[key] for row in rows], rows)
    median["target_steps"] = None
    return median

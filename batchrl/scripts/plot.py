"""Learning curves as PNG from the event files of one or more runs.

    batchrl-plot runs/benchmark/pendulum --output docs/pendulum.png
    batchrl-plot runs/a runs/b --label "lr 1e-4" --label "lr 3e-4" \\
        --output docs/lr.png

Each argument is a run directory (one with `train/` or `eval/` event folders) or a folder
that holds run directories. Runs are grouped into curves by a label: by default the run's
config `env` and the run's name with a `seed-N` suffix removed (the parent folder's name
when nothing is left), so `runs/benchmark/pendulum/seed-{0,1,2}` and
`runs/seeds/pendulum-seed-{0,1,2}` each become one curve; `--label` (once per argument)
names the curve of all runs under that argument instead.

The figure has a row for the eval and for the train `--tag` scalar (default `mean_score`)
and a column for each x axis, as in the figures of Hafner et al. (arXiv:1709.02878):
environment steps (the global step, all agents' training steps) and wall-clock hours. A
curve with several runs shows the median and the 25th-75th percentile band over the runs,
after linear interpolation onto a common grid; each run is also drawn as a thin line.

Wall-clock time counts from the creation of the run's event files (TensorFlow import and
environment start-up excluded, graph tracing included). When a run was resumed, the pause
between the processes (from the last event of one to the creation of the next one's event
files) is left out, so the hours are those spent training.
"""

import argparse
import collections
import dataclasses
import os
import pathlib
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Before TensorBoard imports TensorFlow.

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from tensorboard.backend.event_processing import event_file_loader  # noqa: E402

from batchrl import configs  # noqa: E402
from batchrl.scripts import quiet, train  # noqa: E402
from batchrl.scripts.events import read_scalars  # noqa: E402

PHASES = ("eval", "train")
MAX_POINTS = 500
# The file_version event of an event file has a wall_time truncated to whole seconds.
_MERGE_TOLERANCE = 1.0

Series = collections.namedtuple("Series", "steps, seconds, values")
Series.__doc__ = """One scalar of one run: float64 arrays of equal length, sorted by step.
`steps`: global step (training environment steps); `seconds`: active wall-clock seconds
since the run's first event (pauses between resumed processes removed); `values`."""


@dataclasses.dataclass
class Run:
    """A run directory read back: `config` (its config.yaml, {} if missing) and `series`,
    a dict from phase (`eval`, `train`) to `Series` (phases without the tag are left out)."""

    path: pathlib.Path
    config: dict
    series: dict

    @property
    def total_seconds(self):
        """Active wall-clock seconds until the last event read (0 without events)."""
        return max((float(s.seconds[-1]) for s in self.series.values() if len(s.steps)),
                   default=0.0)


def is_run_dir(path):
    path = pathlib.Path(path)
    return any((path / phase).is_dir() for phase in PHASES)


def find_runs(path):
    """Run directories at or under `path`, sorted; [] when there are none.

    Raises:
      FileNotFoundError: when `path` does not exist.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if is_run_dir(path):
        return [path]
    found = {candidate.parent for phase in PHASES for candidate in path.rglob(phase)
             if candidate.is_dir()}
    return sorted(found, key=_natural_key)


def _natural_key(path):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def merge_segments(intervals, tolerance=_MERGE_TOLERANCE):
    """Merges overlapping `(start, end)` wall-time intervals (one per event file) into the
    intervals in which a training process was writing; returns a sorted list of pairs."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + tolerance:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def active_seconds(wall_times, segments):
    """Seconds since the start of the first segment, without the gaps between segments.

    Args:
      wall_times: array of wall times (seconds since the epoch) inside the segments.
      segments: sorted, non-overlapping `(start, end)` pairs from `merge_segments`.

    Returns:
      float64 array shaped like `wall_times`.
    """
    wall_times = np.asarray(wall_times, np.float64)
    if not segments:
        return np.zeros_like(wall_times)
    starts = np.array([start for start, _ in segments], np.float64)
    ends = np.array([end for _, end in segments], np.float64)
    paused = np.concatenate([[0.0], np.cumsum(np.maximum(starts[1:] - ends[:-1], 0.0))])
    index = np.clip(np.searchsorted(starts, wall_times, side="right") - 1, 0, None)
    return wall_times - starts[0] - paused[index]


def drop_orphans(scalars):
    """Keeps the scalars a resumed run still stands by.

    A process that stopped after its last checkpoint wrote summaries for steps that the
    resumed process writes again; like TensorBoard, a summary at a step not above the last
    one replaces everything written at or after that step before it.

    Args:
      scalars: `Scalar(step, wall_time, value)`s in any order.

    Returns:
      list of `Scalar`s in the order written, steps strictly increasing.
    """
    kept = []
    for scalar in sorted(scalars, key=lambda s: s.wall_time):
        while kept and kept[-1].step >= scalar.step:
            kept.pop()
        kept.append(scalar)
    return kept


def _file_start(path, fallback):
    """The wall_time of an event file's first record (its creation), or `fallback`."""
    try:
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            return event.wall_time
    except Exception:  # A truncated or unreadable file: use the first scalar instead.
        pass
    return fallback


def read_run(run_dir, tag="mean_score"):
    """Reads the `tag` scalars of a run's `eval/` and `train/` event files into a `Run`."""
    run_dir = pathlib.Path(run_dir)
    config_path = run_dir / "config.yaml"
    config = dict(configs.read_run_config(config_path)) if config_path.exists() else {}
    intervals, scalars = [], {}
    for phase in PHASES:
        scalars[phase] = []
        for path in sorted((run_dir / phase).glob("events.out.tfevents.*")):
            values = read_scalars(path, tag)
            end = max((s.wall_time for s in values), default=None)
            start = _file_start(path, fallback=values[0].wall_time if values else None)
            if start is not None:
                intervals.append((start, end if end is not None else start))
            scalars[phase].extend(values)
    segments = merge_segments(intervals)
    series = {}
    for phase in PHASES:
        kept = drop_orphans(scalars[phase])
        if not kept:
            continue
        wall_times = np.array([s.wall_time for s in kept], np.float64)
        series[phase] = Series(np.array([s.step for s in kept], np.float64),
                               active_seconds(wall_times, segments),
                               np.array([s.value for s in kept], np.float64))
    return Run(run_dir, config, series)


def group_name(run_dir):
    """The run's name without a seed suffix: `pendulum-seed-0` -> `pendulum`; `seed-0`,
    `0` -> the parent folder's name; other names are kept."""
    run_dir = pathlib.Path(run_dir).resolve()
    match = re.fullmatch(r"(.*?)[-_.]?seed[-_]?\d+|\d+", run_dir.name, re.IGNORECASE)
    if match:
        return match.group(1) or run_dir.parent.name
    return run_dir.name


def default_label(run):
    """`ENV (NAME)`: the config's `env` and the `group_name` of the run directory."""
    name = group_name(run.path)
    env = run.config.get("env")
    return f"{env} ({name})" if env else name


def group_runs(runs, labels=None):
    """Groups runs into curves: dict label -> list of `Run`s, in order of first appearance.

    Args:
      runs: list of `Run`s.
      labels: None (use `default_label`) or one label per run.
    """
    groups = {}
    for index, run in enumerate(runs):
        label = labels[index] if labels else default_label(run)
        groups.setdefault(label, []).append(run)
    return groups


def common_grid(xs, max_points=MAX_POINTS):
    """A grid for runs whose x values are `xs` (a list of increasing arrays).

    The grid spans the range that every run covers: it holds the runs' own x values in that
    range (so runs logged at the same steps are not interpolated), or `max_points` evenly
    spaced values when there would be more. Empty when the runs do not overlap.
    """
    xs = [np.asarray(x, np.float64) for x in xs if len(x)]
    if not xs:
        return np.zeros(0)
    low = max(float(x[0]) for x in xs)
    high = min(float(x[-1]) for x in xs)
    if low > high:
        return np.zeros(0)
    points = np.unique(np.concatenate(xs))
    points = points[(points >= low) & (points <= high)]
    if len(points) > max_points:
        points = np.linspace(low, high, max_points)
    return points


Aggregate = collections.namedtuple("Aggregate", "grid, values, low, median, high")
Aggregate.__doc__ = """Runs on a common grid: `grid` [points]; `values` [runs, points],
each run linearly interpolated; `low`, `median`, `high` [points], the 25th, 50th and 75th
percentiles over the runs (numpy's default, linear, method)."""


def aggregate(xs, ys, max_points=MAX_POINTS, percentiles=(25, 50, 75)):
    """Interpolates runs onto `common_grid(xs)` and takes percentiles over the runs.

    Args:
      xs: list of increasing 1-D arrays (steps or seconds), one per run.
      ys: list of 1-D arrays of the same lengths (the scalar values).
      max_points: the largest grid.
      percentiles: the low, middle and high percentiles.

    Returns:
      `Aggregate`; its arrays are empty when the runs do not overlap.
    """
    pairs = [(np.asarray(x, np.float64), np.asarray(y, np.float64))
             for x, y in zip(xs, ys, strict=True) if len(x)]
    grid = common_grid([x for x, _ in pairs], max_points)
    if not len(grid):
        empty = np.zeros(0)
        return Aggregate(grid, np.zeros((len(pairs), 0)), empty, empty, empty)
    values = np.stack([np.interp(grid, x, y) for x, y in pairs])
    low, median, high = np.percentile(values, percentiles, axis=0)
    return Aggregate(grid, values, low, median, high)


def plot_groups(groups, output, tag="mean_score", title=None, threshold=None, dpi=120):
    """Writes a PNG of learning curves.

    Rows: the phases that have data (`eval`, `train`); columns: against environment steps
    and against wall-clock hours. Each group is one color: its median over runs, the
    25th-75th percentile band, and a thin line per run.

    Args:
      groups: dict label -> list of `Run`s (from `group_runs`).
      output: the PNG path (folders are created).
      tag: the scalar's name, for the axis labels.
      title: the figure title (None: a default naming the statistic).
      threshold: optional score drawn as a dashed line in the eval panels.

    Returns:
      the output path.

    Raises:
      ValueError: when no run has the scalar.
    """
    phases = [phase for phase in PHASES
              if any(phase in run.series for runs in groups.values() for run in runs)]
    if not phases:
        raise ValueError(f"no run has the scalar {tag!r} in eval/ or train/")
    figure = Figure(figsize=(11, 3.6 * len(phases) + 0.6), dpi=dpi, layout="constrained")
    axes = figure.subplots(len(phases), 2, squeeze=False, sharey="row")
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, phase in enumerate(phases):
        for column, (x_name, scale) in enumerate((("steps", 1.0), ("seconds", 3600.0))):
            ax = axes[row, column]
            for index, (label, runs) in enumerate(groups.items()):
                color = colors[index % len(colors)]
                series = [run.series[phase] for run in runs if phase in run.series]
                if not series:
                    continue
                xs = [getattr(s, x_name) / scale for s in series]
                ys = [s.values for s in series]
                if len(series) > 1:
                    for x, y in zip(xs, ys, strict=True):
                        ax.plot(x, y, color=color, alpha=0.3, linewidth=0.7)
                    stats = aggregate(xs, ys)
                    ax.fill_between(stats.grid, stats.low, stats.high, color=color,
                                    alpha=0.25, linewidth=0)
                    ax.plot(stats.grid, stats.median, color=color, linewidth=1.8,
                            label=f"{label}, median of {len(series)}")
                else:
                    ax.plot(xs[0], ys[0], color=color, linewidth=1.8, label=label)
            if threshold is not None and phase == "eval":
                ax.axhline(threshold, color="gray", linestyle="--", linewidth=1,
                           label=f"threshold {threshold:g}")
            ax.grid(alpha=0.3)
            if x_name == "steps":
                ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
                ax.set_xlabel("environment steps")
                ax.set_ylabel(f"{phase} {tag}")
            else:
                ax.set_xlabel("wall-clock hours")
    axes[0, 0].legend(loc="best", fontsize="small")
    figure.suptitle(title or f"{tag}: median and 25th-75th percentiles over runs "
                             f"(thin lines: single runs)")
    output = pathlib.Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)
    return output


def load_groups(paths, labels=None, tag="mean_score"):
    """Finds and reads the runs under `paths` and groups them (see `group_runs`).

    Args:
      paths: run directories or folders of runs.
      labels: None, or one label per path for all runs found under it.

    Raises:
      ValueError: when `labels` does not match `paths` or a path holds no run.
    """
    if labels and len(labels) != len(paths):
        raise ValueError(f"give one --label per path ({len(paths)} paths, "
                         f"{len(labels)} labels)")
    runs, run_labels = [], []
    for index, path in enumerate(paths):
        found = find_runs(path)
        if not found:
            raise ValueError(f"no run directory (with train/ or eval/) under {path}")
        for run_dir in found:
            runs.append(read_run(run_dir, tag))
            if labels:
                run_labels.append(labels[index])
    return group_runs(runs, run_labels or None)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m batchrl.scripts.plot",
        description="Learning curves (median and 25th-75th percentiles over seeds) as PNG "
                    "from the event files of runs.")
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR_OR_GROUP",
                        help="a run directory or a folder of run directories")
    parser.add_argument("--output", required=True, help="the PNG file to write")
    parser.add_argument("--tag", default="mean_score", help="the scalar (default: %(default)s)")
    parser.add_argument("--title", help="the figure title")
    parser.add_argument("--label", action="append", default=[],
                        help="the curve's label for the runs under each path (once per path)")
    parser.add_argument("--threshold", type=float, help="draw this eval score as a line")
    quiet.add_verbose_flag(parser)
    args = parser.parse_args(argv)
    train.start_tensorflow(args.verbose)  # TensorBoard's event reader imports TensorFlow.
    try:
        groups = load_groups(args.paths, args.label, args.tag)
        output = plot_groups(groups, args.output, args.tag, args.title, args.threshold)
    except (FileNotFoundError, ValueError, configs.ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for label, runs in groups.items():
        print(f"{label}: {len(runs)} run(s): {', '.join(str(run.path) for run in runs)}")
    print(f"Wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

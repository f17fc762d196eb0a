"""The throughput benchmark's report: ratios against baselines, the goals, the JSON file
and the Markdown report (which keeps the sections of `breakdown` and of
`benchmarks.ray_scaling`)."""

import dataclasses
import datetime
import json
import pathlib

import numpy as np

from batchrl import environments
from benchmarks import ray_scaling
from benchmarks.throughput import baselines, breakdown
from benchmarks.throughput.settings import (
    BASELINES,
    GOALS,
    KINDS,
    LEARNING_CONFIG,
    LEARNING_THRESHOLD,
)


def paired_ratio(measurement, reference):
    """`measurement`'s steps/s over `reference`'s (`Measurement`s), or None without a
    reference: the median of the per-round ratios when both were repeated in the same
    rounds (`run_benchmark` runs the kinds of one environment and size round by round, so
    that a slow spell of the machine hits both sides of a ratio), else the ratio of the
    two figures."""
    if reference is None or not reference.steps_per_second:
        return None
    ours, theirs = measurement.samples, reference.samples
    if len(ours) > 1 and len(ours) == len(theirs) and all(theirs):
        return float(np.median([a / b for a, b in zip(ours, theirs, strict=True)]))
    return measurement.steps_per_second / reference.steps_per_second


def build_report(measurements, settings, command, machine=None, date=None, learning=None,
                 pairs=None):
    """The report: machine, date, command, settings, one row per measurement with ratios,
    the paired measurements, the learning runs and the goals.

    Each row holds the `Measurement`'s fields, `steps_per_second`, and the ratios
    `vs_single_env` (against one environment in a plain loop, per core), `vs_core_limit`
    (against that times `cpu_count`), `baseline` (a kind, see `BASELINES`, or None when
    it was not measured) and `vs_baseline` (against that kind's figure for the same
    environment and size: `paired_ratio`). `core_limit` holds, per environment, the single
    environment's steps/s times `os.cpu_count()` (`core_limit_factor`). `pairs` holds
    each `PairedMeasurement`'s fields with `ratio` (the median) and `ratio_range` (25th and
    75th percentiles). `goals` holds one entry per `GOALS` item with the measured `value`
    (None when not measured) and `met`.

    Args:
      measurements: `Measurement`s.
      settings: dict of the benchmark's settings (recorded as they are).
      command: the command line (str).
      machine: `machine_info()` (measured now if None).
      date: ISO date and time (now if None).
      learning: optional list of `measure_learning` results.
      pairs: optional list of `PairedMeasurement`s.

    Returns:
      dict, JSON-serializable.
    """
    machine = machine or baselines.machine_info()
    cpu_count = machine["cpu_count"] or 1
    by_key = {(m.env, m.kind, m.num_envs): m for m in measurements}
    single = {m.env: m.steps_per_second for m in measurements if m.kind == "single_env"}
    rows = []
    for m in measurements:
        rate = m.steps_per_second
        reference = by_key.get((m.env, BASELINES.get(m.kind), m.num_envs))
        per_core = single.get(m.env)
        rows.append({
            **dataclasses.asdict(m),
            "steps_per_second": rate,
            "vs_single_env": rate / per_core if per_core else None,
            "vs_core_limit": rate / (per_core * cpu_count) if per_core else None,
            "baseline": reference and reference.kind,
            "vs_baseline": paired_ratio(m, reference),
        })
    return {
        "date": date or datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "machine": machine,
        "settings": settings,
        "core_limit_factor": {"value": cpu_count, "source": "os.cpu_count()"},
        "core_limit": {env: rate * cpu_count for env, rate in single.items()},
        "kinds": KINDS,
        "rows": rows,
        "pairs": [
            {**dataclasses.asdict(pair), "ratio": pair.ratio,
             "ratio_range": [float(np.percentile(pair.ratios, q)) for q in (25, 75)]}
            for pair in pairs or []],
        "learning": learning or [],
        "goals": check_goals(rows, pairs or [], learning or [], cpu_count),
    }


def check_goals(rows, pairs, learning, cpu_count):
    """Each of `GOALS` with its measured `value` and whether it is `met` (None when not
    measured); for the learning goal `value` is the slowest seed's seconds (infinite when
    a seed never reached the threshold).

    Args:
      rows: the report's rows (dicts with `env`, `kind`, `num_envs` and the ratios).
      pairs: `PairedMeasurement`s.
      learning: `measure_learning` results.
      cpu_count: the core count of the core limit.
    """
    by_key = {(row["env"], row["kind"], row["num_envs"]): row for row in rows}
    paired = {(p.env, p.kind, p.baseline, p.num_envs): p for p in pairs}
    goals = []
    for goal in GOALS:
        if goal["measure"] == "paired":
            pair = paired.get((goal["env"], goal["kind"], goal["baseline"], goal["num_envs"]))
            factor = cpu_count if goal["baseline"] == "single_env" else 1
            value = None if pair is None else pair.ratio / factor
            met = None if value is None else value >= goal["target"]
        elif goal["measure"] == "seconds_to_threshold":
            times = [run["seconds_to_threshold"] for run in learning]
            value = (max(float("inf") if t is None else t for t in times)
                     if times else None)
            met = None if value is None else value < goal["target"]
        else:
            row = by_key.get((goal["env"], goal["kind"], goal["num_envs"]))
            value = None if row is None else row[goal["measure"]]
            met = None if value is None else value >= goal["target"]
        goals.append({**goal, "value": value, "met": met})
    return goals


def write_json(report, path):
    """Writes the report as JSON to `path` (parent directories are created)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def _ratio(value):
    return "–" if value is None else f"{value:.2f}×"


def markdown(report):
    """The report as Markdown (str): header, a steps/s overview per environment (kinds ×
    sizes) and a table of every figure with its ratios."""
    machine, settings = report["machine"], report["settings"]
    cores = machine["cpu_count"]
    lines = [
        "# Throughput: environment steps per second",
        "",
        f"Measured {report['date']} with `{report['command']}`.",
        "",
        f"Machine: {cores} CPUs (`os.cpu_count()`), {machine['cpu']}; {machine['platform']}; "
        f"Python {machine['python']}, TensorFlow {machine['tensorflow']}, Gymnasium "
        f"{machine['gymnasium']}, MuJoCo {machine['mujoco']}, NumPy {machine['numpy']}.",
        "",
    ]
    if machine.get("effective_cores"):
        before, after = machine["effective_cores"]
        lines += [
            f"Effective cores: {before:.2f} at the start and {after:.2f} at the end of the "
            f"run ({cores} processes running the same busy loop together, each one's speed "
            "against one running it alone, summed; "
            f"{cores} means {cores} full cores; less when the host is shared or the cores are "
            "hyperthreads).", ""]
    lines += [
        f"Settings: {settings['seconds']:g} s timed per measurement after {settings['warmup']:g} s "
        f"of warm-up (the first `tf.function` call, which traces, is part of it); "
        + (f"each figure is the median of {settings['repeats']} repeats, run in rounds of "
           f"every kind for one environment and size (`range`: the slowest and fastest "
           f"repeat); " if settings.get("repeats", 1) > 1 else "")
        + ("TensorFlow's inter-op threads as training sets them (1 for in-process "
           "Gymnasium environments, else TensorFlow's default); "
           if settings.get("inter_op_threads") is None else
           f"TensorFlow with {settings['inter_op_threads']} inter-op threads (0: its "
           "default); ")
        + "K = "
        f"{settings.get('steps_per_call', 1)} batch steps per call in the K-step kinds; "
        + (f"`ppo_training` runs on to the end of an update, at least "
           f"{settings['min_updates']} in the window."
           if settings["min_updates"] > 0 else "`ppo_training` is not required to update.")
        + (
            " **Quick mode: a smoke test with tiny sizes and times, not a measurement.**"
            if settings.get("quick") else ""),
        "",
        "Steps count every environment's step. `× 1 env` compares with one environment "
        f"stepped in a plain Python loop (per core); `× {cores}-core limit` with that times "
        f"`os.cpu_count()` = {cores}, the bound for perfectly parallel, overhead-free "
        "stepping. `vs baseline` compares with the named row of the same environments and "
        "size in the same run (with repeats: the median of the ratios of each round). "
        "Absolute figures drift with the load of the machine: compare within one run.",
        "",
    ]
    lines += _goals_markdown(report["goals"])
    lines += ["| kind | what |", "|---|---|"]
    lines += [f"| `{kind}` | {text} |" for kind, text in report["kinds"].items()]
    rows = report["rows"]
    for env in dict.fromkeys(row["env"] for row in rows):
        env_rows = [row for row in rows if row["env"] == env]
        single = [row for row in env_rows if row["kind"] == "single_env"]
        per_core = [row for row in env_rows if row["kind"] == "single_env_per_core"]
        batched = [row for row in env_rows
                   if row["kind"] not in ("single_env", "single_env_per_core")]
        sizes = sorted({row["num_envs"] for row in batched})
        lines += ["", f"## {env}", ""]
        if single:
            rate = single[0]["steps_per_second"]
            equivalent = environments.gymnasium_id(env)
            what = f" ({equivalent}, the Gymnasium equivalent)" if equivalent != env else ""
            measured = ""
            if per_core:
                measured = (f"; one loop per core in {per_core[0]['num_envs']} processes at "
                            f"once (`single_env_per_core`): "
                            f"{per_core[0]['steps_per_second']:,.0f} steps/s, "
                            f"{_ratio(per_core[0]['vs_core_limit'])} the {cores}-core limit")
            lines += [f"One environment{what} in a plain loop: **{rate:,.0f} steps/s** per "
                      f"core; {cores}-core limit {rate * cores:,.0f} steps/s{measured}.", ""]
        lines += ["Steps/s:", "",
                  "| kind | " + " | ".join(f"{size} envs" for size in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        by_key = {(row["kind"], row["num_envs"]): row for row in batched}
        for kind in KINDS:
            if not any((kind, size) in by_key for size in sizes):
                continue
            cells = [f"{by_key[kind, size]['steps_per_second']:,.0f}"
                     if (kind, size) in by_key else "–" for size in sizes]
            lines.append(f"| `{kind}` | " + " | ".join(cells) + " |")
        lines += ["", "Every figure:", "",
                  f"| envs | kind | steps/s | range | × 1 env | × {cores}-core limit | "
                  "vs baseline | calls | s timed | setup s | updates |",
                  "|---:|---|---:|---|---:|---:|---|---:|---:|---:|---:|"]
        order = {kind: index for index, kind in enumerate(KINDS)}
        for row in sorted(env_rows, key=lambda r: (r["num_envs"], order.get(r["kind"], 99))):
            baseline = ("–" if row["baseline"] is None
                        else f"{_ratio(row['vs_baseline'])} `{row['baseline']}`")
            updates = "" if row["updates"] is None else str(row["updates"])
            samples = row.get("samples") or ()
            spread = f"{min(samples):,.0f}–{max(samples):,.0f}" if samples else "–"
            lines.append(
                f"| {row['num_envs']} | `{row['kind']}` | {row['steps_per_second']:,.0f} | "
                f"{spread} | "
                f"{_ratio(row['vs_single_env'])} | {_ratio(row['vs_core_limit'])} | "
                f"{baseline} | {row['calls']:,} | {row['seconds']:.2f} | "
                f"{row['setup_seconds']:.2f} | {updates} |")
    lines += _pairs_markdown(report.get("pairs") or [], cores)
    lines += _learning_markdown(report.get("learning") or [])
    return "\n".join(lines) + "\n"


def _goal_value(goal):
    value = goal["value"]
    if value is None:
        return "not measured"
    if goal["measure"] == "seconds_to_threshold":
        return "not reached" if value == float("inf") else f"{value:.0f} s (slowest seed)"
    if goal["measure"] == "steps_per_second":
        return f"{value:,.0f}"
    return f"{value:.2f}×"


def _goals_markdown(goals):
    """The goals table (lines of Markdown)."""
    lines = ["## Goals", "", "| goal | target | measured | met |", "|---|---|---|---|"]
    for goal in goals:
        target = goal["target"]
        if goal["measure"] == "seconds_to_threshold":
            target = f"< {target:g} s"
        elif goal["measure"] == "steps_per_second":
            target = f"≥ {target:,.0f}"
        else:
            target = f"≥ {target:g}×"
        met = {True: "yes", False: "**no**", None: "–"}[goal["met"]]
        lines.append(f"| {goal['what']} | {target} | {_goal_value(goal)} | {met} |")
    return lines + [""]


def _pairs_markdown(pairs, cores):
    """The paired measurements' table (lines of Markdown; none without pairs)."""
    if not pairs:
        return []
    lines = [
        "", "## Paired measurements", "",
        "Both kinds built in one process, then timed in alternating windows of 0.25 s, each "
        "kind first in every other pair; each pair of adjacent windows gives one ratio, so "
        "that a slow spell of the shared host hits both sides of it. Against `single_env` "
        f"the ratio is also given per core limit (divided by {cores}); against "
        "`single_env_per_core` it is the share of the core limit as the machine gives it "
        "(one loop per core, all at once).", "",
        "| envs | kind | baseline | kind steps/s | baseline steps/s | ratio (median) | "
        "25th–75th percentile | pairs |",
        "|---:|---|---|---:|---:|---:|---|---:|"]
    for pair in pairs:
        low, high = pair["ratio_range"]
        ratio = f"{pair['ratio']:.2f}×"
        if pair["baseline"] == "single_env":
            ratio += f" ({pair['ratio'] / cores:.2f}× the {cores}-core limit)"
        elif pair["baseline"] == "single_env_per_core":
            ratio += " of the measured limit"
        lines.append(
            f"| {pair['num_envs']} | `{pair['kind']}` ({pair['env']}) | `{pair['baseline']}` "
            f"| {pair['steps_per_second']:,.0f} | {pair['baseline_steps_per_second']:,.0f} | "
            f"{ratio} | {low:.2f}–{high:.2f} | {len(pair['ratios'])} |")
    return lines


def _learning_markdown(runs):
    """The learning runs' table (lines of Markdown; none without runs)."""
    if not runs:
        return []

    def number(value, text="{:,.0f}"):
        return "not reached" if value is None else text.format(value)

    lines = [
        "", f"## BatchPPO on the in-graph Pendulum (`{LEARNING_CONFIG}`)", "",
        f"`python -m batchrl.scripts.train --config={LEARNING_CONFIG} --set seed=SEED --set "
        f"steps=N`, one seed after the other, nothing else running. Seconds to the first "
        f"eval return ≥ {LEARNING_THRESHOLD:g}: from the command's start (Python and "
        "TensorFlow start-up, tracing and evaluations included), and from the creation of "
        "the run's event files (as in docs/results.md).", "",
        "| seed | steps to ≥ threshold | s from the command's start | s of training | "
        "final eval return | best eval return | command s (whole run) |",
        "|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        lines.append(
            f"| {run['seed']} | {number(run['steps_to_threshold'])} | "
            f"{number(run['seconds_to_threshold'], '{:.0f}')} | "
            f"{number(run['training_seconds_to_threshold'], '{:.0f}')} | "
            f"{number(run['final_return'], '{:.1f}')} | "
            f"{number(run['best_return'], '{:.1f}')} | {run['command_seconds']:.0f} "
            f"({run['steps']:,} steps) |")
    return lines


def write_markdown(report, path):
    """Writes `markdown(report)` to `path` (parent directories are created), keeping the
    sections that `breakdown` and `benchmarks.ray_scaling` wrote there, if any."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = breakdown.read_section(path)
    kept_ray = ray_scaling.read_section(path, "performance")
    path.write_text(markdown(report))
    if kept:
        breakdown.write_section(path, kept)
    if kept_ray:
        ray_scaling.write_section(path, kept_ray, "performance")

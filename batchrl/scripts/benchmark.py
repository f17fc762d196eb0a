"""Train configs x seeds and report how fast and how well they learn, with plots.

    batchrl-benchmark --configs pendulum --seeds 0 1 2
    batchrl-benchmark --configs pendulum --steps 200000 \\
        --threshold pendulum=-200 --logdir runs/short --output docs/short.md
    batchrl-benchmark --report-only

Each run is one `python -m batchrl.scripts.train --config=CONFIG --set seed=SEED` process
in LOGDIR/CONFIG/seed-SEED, its output shown and appended to RUN_DIR/train.log. A run whose
checkpoint already reached its `steps` is skipped; an incomplete one is resumed (the same
command continues from its last checkpoint). After every run, and with `--report-only`
without training, the report is rewritten from the event files of all runs under LOGDIR
(`--report-only`: filtered by `--configs` / `--seeds` when given): OUTPUT (default
docs/results.md), opening with one table of every config under configs/ (the first eval at
or above its threshold beside its final eval, from its section or else from the newest
other report of batchrl-benchmark in OUTPUT's folder, "not measured" without a recorded
run), then a table per config (per seed and the median over seeds) and a plot per config
next to it (docs/CONFIG.png, made with batchrl-plot); the text of LOGDIR/CONFIG/notes.md,
where one exists, goes under the config's heading (e.g. which runs shared the machine).
The section of a config without runs under LOGDIR is kept from the report already at
OUTPUT, with a line saying so (run directories do not outlive a machine, the report
does). Give trial runs their own LOGDIR and OUTPUT.

Columns: the final and the best eval `mean_score` (mean action, `eval_episodes` episodes);
at the first eval score >= the config's threshold (`--threshold CONFIG=VALUE`; built in:
pendulum and pendulum_native -200, cartpole 500, pendulum_trpo -250; otherwise the Gymnasium
`reward_threshold` of the config's environment), the training steps, the training
wall-clock seconds (the eval's `time/training_seconds`: from the start of training, graph
tracing, updates, evaluations and checkpoints included; of which, in parentheses, tracing
and optimizing the step function) and the seconds from the launch of
the training command (Python's and TensorFlow's start-up included); the run's total
wall-clock hours and hours per 1M steps (from the creation of the run's event files,
without the pauses between resumed processes, see batchrl-plot); and the training
steps/s (`train_speed`: the train phases' steps over their seconds, updates included, from
the event files). Configs with a target (TARGETS: the issue's time
targets, published tuned PPO returns at 1M steps) get a line saying whether it is met.
"""

import argparse
import datetime
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

from batchrl import configs
from batchrl.scripts import plot, quiet, run_summary, train

DEFAULT_THRESHOLDS = {"pendulum": -200.0, "pendulum_native": -200.0, "cartpole": 500.0,
                      "pendulum_trpo": -250.0, "pendulum_sac": -200.0, "cartpole_dqn": 500.0,
                      "minatar_breakout": 28.0, "minatar_space_invaders": 131.0,
                      "minatar_breakout_native": 28.0, "minatar_breakout_dqn": 28.0,
                      "masked_choice": 14.0, "image_and_cue": 18.0, "pong": 0.0,
                      "pendulum_appo": -200.0, "cartpole_impala": 500.0, "pong_appo": 18.0,
                      "cartpole_apex": 500.0, "cartpole_dqn_actor": 500.0,
                      "minatar_breakout_apex": 28.0,
                      "pong_apex": 18.0, "cue_recall_appo": 0.9, "cartpole_pqn": 500.0,
                      "minatar_breakout_pqn": 28.0, "minatar_breakout_native_pqn": 28.0,
                      "minatar_space_invaders_pqn": 131.0, "pong_pqn": 18.0}
NOTES_NAME = "notes.md"  # LOGDIR/CONFIG/notes.md, shown under the config's heading.
# What each config should reach (issues "Learn fast" and "From the command to the
# answer"; published tuned PPO results at 1M steps: Stable-Baselines3 rl-zoo), shown beside
# its table and checked on the median row (`median_seconds`, `median_command_seconds`,
# ...) or on every seed (`command_seconds`, `max_steps`). The time targets
# of pendulum and pendulum_native include tracing and XLA's compilation, as the JAX peer's
# 5.5-6.1 s does. `peer_steps_per_second`: that peer's train steps/s, updates included, to
# report the median beside, not a check.
TARGETS = {
    "pendulum": dict(median_seconds=4, median_command_seconds=6, command_seconds=8,
                     max_steps=40_000),
    "pendulum_native": dict(median_seconds=4, median_command_seconds=6, command_seconds=8,
                            peer_steps_per_second=45_000),
    "cartpole": dict(median_seconds=30),
    "cheetah": dict(final_return=5819),
    "hopper": dict(final_return=2410),
    "walker": dict(final_return=3479),
    "ant": dict(final_return=1327),
    # Issue "Algorithms from parts": eval >= -250 (pendulum_trpo) and >= 475 (cartpole_a2c,
    # Gymnasium's threshold) within 1M steps, every seed.
    "pendulum_trpo": dict(max_steps=1_000_000),
    "cartpole_a2c": dict(max_steps=1_000_000),
    # Issue "Learning from a replay memory" (the zoo's SAC: -157 after 20k steps; its DQN:
    # 500 at 50k; PPO's 1M-step median on HalfCheetah, 5,796, at 300k steps).
    "pendulum_sac": dict(median_seconds=15, median_steps=10_000),
    # Issue 42: its final eval, as the zoo reports its DQN's (a first hit of 500 may not
    # last); 475, Gymnasium's reward_threshold of CartPole-v1.
    "cartpole_dqn": dict(final_return=475),
    "cheetah_sac": dict(final_return=5796),
    # One seed each at 1M steps beside rl-baselines3-zoo's SAC (benchmark.md, v3 tasks).
    "hopper_sac": dict(final_return=2326),
    "walker_sac": dict(final_return=3863),
    "ant_sac": dict(final_return=4616),
    # Issue "Pixels": gymnax's published PPO checkpoints after 10M steps (Breakout 28,
    # SpaceInvaders 131), reached within 5M; the test tasks of masks and of two inputs
    # reach their thresholds (14 of the best allowed choices' 14.6; 18 of 20).
    "minatar_breakout": dict(max_steps=5_000_000),
    "minatar_breakout_native": dict(max_steps=5_000_000),
    "minatar_breakout_dqn": dict(max_steps=5_000_000),
    "minatar_space_invaders": dict(max_steps=5_000_000),
    # Pong: an eval return >= 0 within 1.5 hours of training on this machine.
    "pong": dict(median_seconds=5400),
    # Issue 44: pong_appo >= 18 within 1.5 hours here (RLlib's release test: 18 within 5M
    # steps and 30 minutes, on 32 CPUs and a GPU).
    "pong_appo": dict(median_seconds=5400),
    # Issue 45 (Ape-X): cartpole_apex's final eval >= 475, as cartpole_dqn's, and
    # cartpole_dqn_actor's (cartpole_dqn on an actor without lag). Issue 61:
    # minatar_breakout_apex 28 within 600 s (issue 45 asked 25.8, DQN's best, within
    # 2,340 s), where minatar_breakout (PPO) needed 362; pong_apex (seed 0) 18 within 1.5
    # hours (issue 45 asked 0 within 2).
    "minatar_breakout_apex": dict(median_seconds=600),
    "cartpole_apex": dict(final_return=475),
    "cartpole_dqn_actor": dict(final_return=475),
    "pong_apex": dict(median_seconds=5400),
    "masked_choice": dict(max_steps=60_000),
    "image_and_cue": dict(max_steps=100_000),
    # Issue 61: the memory task solved on an actor by the unrolled GRU (a guess scores 0).
    "cue_recall_appo": dict(max_steps=200_000),
}


def _number(value, digits=1, thousands=False, missing="—"):
    if value is None:
        return missing
    return f"{value:,.0f}" if thousands else f"{value:.{digits}f}"


def _training_seconds(row, missing):
    """The training seconds to the threshold, with the tracing part where known."""
    text = _number(row["seconds_to_threshold"], missing=missing)
    if row["seconds_to_threshold"] is not None and row.get("tracing_seconds") is not None:
        text += f" ({row['tracing_seconds']:.1f} tracing)"
    return text


# The header of a config's table (`table`); its first five columns, those of every
# report's tables so far, are how `section_figures` finds a table again.
TABLE_HEADER = ("| seed | final step | final eval return | best eval return | steps to ≥ "
                "threshold | training s to ≥ threshold | s from the command to ≥ threshold "
                "| total hours | hours per 1M steps | train steps/s |")
TABLE_PREFIX = TABLE_HEADER.split(" | training s")[0] + " |"


def table(rows, threshold):
    """A Markdown table of `run_summary.summarize` rows followed by their median row."""
    reached = "not reached" if threshold is not None else "—"
    lines = [TABLE_HEADER, "|---|---|---|---|---|---|---|---|---|---|"]
    for row in [*rows, run_summary.median_row(rows)] if len(rows) > 1 else rows:
        final_step = _number(row["final_step"], thousands=True)
        if row["target_steps"] and (row["final_step"] or 0) < row["target_steps"]:
            final_step += f" of {row['target_steps']:,} (incomplete)"
        seed = "**median**" if row["seed"] == "median" else row["seed"]
        lines.append(
            f"| {seed} | {final_step} | {_number(row['final_return'])} | "
            f"{_number(row['best_return'])} | "
            f"{_number(row['steps_to_threshold'], thousands=True, missing=reached)} | "
            f"{_training_seconds(row, reached)} | "
            f"{_number(row['command_seconds'], missing=reached)} | "
            f"{_number(row['total_hours'], digits=3)} | "
            f"{_number(row['hours_per_million'], digits=2)} | "
            f"{_number(row['steps_per_second'], thousands=True)} |")
    return "\n".join(lines) + "\n"


def _all_within(rows, key, bound):
    values = [row[key] for row in rows]
    return all(value is not None and value <= bound for value in values)


def target_text(config, rows):
    """A line stating the config's target (`TARGETS`) and whether `rows` meet it; None
    for a config without a target."""
    target = TARGETS.get(config)
    if not target:
        return None
    median = run_summary.median_row(rows) if len(rows) > 1 else rows[0]
    checks = []
    if "median_seconds" in target:
        value = median["seconds_to_threshold"]
        checks.append((f"≤ {target['median_seconds']} s of training to the threshold "
                       f"(median seed)", value is not None
                       and value <= target["median_seconds"]))
    if "median_command_seconds" in target:
        value = median["command_seconds"]
        checks.append((f"≤ {target['median_command_seconds']} s from the command (median "
                       f"seed)", value is not None
                       and value <= target["median_command_seconds"]))
    if "median_steps" in target:
        value = median["steps_to_threshold"]
        checks.append((f"within ≤ {target['median_steps']:,} steps (median seed)",
                       value is not None and value <= target["median_steps"]))
    if "max_steps" in target:
        checks.append((f"within ≤ {target['max_steps']:,} steps (every seed)",
                       _all_within(rows, "steps_to_threshold", target["max_steps"])))
    if "command_seconds" in target:
        checks.append((f"≤ {target['command_seconds']} s from the command (every seed)",
                       _all_within(rows, "command_seconds", target["command_seconds"])))
    if "final_return" in target:
        value = median["final_return"]
        checks.append((f"final eval return ≥ {target['final_return']:,} (median seed)",
                       value is not None and value >= target["final_return"]))
    parts = "; ".join(f"{text}: {'met' if ok else '**not met**'}" for text, ok in checks)
    text = f"Target: {parts}."
    if "peer_steps_per_second" in target:
        speed = median["steps_per_second"]
        speed = "unknown" if speed is None else f"{speed:,.0f}"
        text += (f" Train steps/s, updates included (median seed): {speed}; the JAX "
                 f"peer's: about {target['peer_steps_per_second']:,}.")
    return text


def env_threshold(env_id):
    """The Gymnasium registry's `reward_threshold` of an environment id, or None; an
    EnvPool task (`envpool:HalfCheetah-v5`) takes that of the Gymnasium id it is named
    after, if any."""
    try:
        import gymnasium

        from batchrl import environments

        task = environments.envpool_task(env_id) or env_id
        return gymnasium.spec(task).reward_threshold
    except Exception:  # Unknown or unregistered id: no threshold.
        return None


def config_overrides(config_name, run_config):
    """`KEY=VALUE` strings where a run's config.yaml differs from configs/CONFIG.yaml
    (`seed` left out); None when the config name is unknown."""
    try:
        named = configs.load(config_name)
    except configs.ConfigError:
        return None
    return [f"{key}={run_config[key]}" for key in run_config
            if key != "seed" and named.get(key) != run_config[key]]


KEPT_NOTE = "Kept from the report written {date}: its runs are not under `{logdir}` now."


def earlier_sections(output):
    """The config sections of an existing report: dict config -> the section's lines (from
    its `## CONFIG (ENV)` heading to the next), each led by a line saying where it was kept
    from; {} when there is no report."""
    try:
        text = pathlib.Path(output).read_text()
    except FileNotFoundError:
        return {}
    date = re.search(r"^Written by .*? on (.+?) from ", text, re.MULTILINE)
    date = date[1] if date else "earlier"
    sections, current = {}, None
    for line in text.splitlines():
        heading = re.match(r"## (\S+) \(", line)
        if heading:
            current = sections.setdefault(heading[1], {"date": date, "lines": []})
        if current is not None:
            current["lines"].append(line)
    return sections


def _kept_section(section, logdir, note=True):
    """An earlier report's section, with the note that it was kept (once) if `note`."""
    lines = list(section["lines"])
    while lines and not lines[-1].strip():
        lines.pop()
    note = note and KEPT_NOTE.format(date=section["date"], logdir=logdir)
    if note and not any(line.startswith("Kept from the report written") for line in lines):
        lines[1:1] = ["", note]
    return lines + [""]


def section_figures(lines):
    """What a config's section says of its runs, read back from its text: dict with `env`
    (from its heading), `seeds` and `threshold` (from its "N seed(s) in ...; threshold T"
    line; "—" where missing) and, from its table's median row (its only row for one seed),
    `final_step`, `final_return`, `best_return` and `steps_to_threshold`, the cells as
    written; None for a section without a table of `batchrl-benchmark` (one written by
    hand). Tables of older reports, with other columns after these four, are read too."""
    text = "\n".join(lines)
    if TABLE_PREFIX not in text:
        return None
    rows = []
    for line in text.split(TABLE_PREFIX, 1)[1].splitlines()[2:]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    row = next((row for row in rows if row[0] == "**median**"), rows[0] if rows else None)
    if row is None:
        return None
    env = re.match(r"## \S+ \((.*)\)\s*$", lines[0])
    seeds = re.search(r"^(\d+) seed\(s\) in ", text, re.MULTILINE)
    threshold = re.search(r"; threshold (\S+?)[;( ]", text)
    return {"env": env[1] if env else "—", "seeds": seeds[1] if seeds else "—",
            "threshold": threshold[1] if threshold else "—", "final_step": row[1],
            "final_return": row[2], "best_return": row[3], "steps_to_threshold": row[4]}


def other_reports(output):
    """The other reports of `batchrl-benchmark` in the folder of `output` and below it
    (e.g. a trial's docs/short.md next to docs/results.md), newest first: a list of
    (path relative to that folder, the date they were written, `earlier_sections`)."""
    output = pathlib.Path(output)
    found = []
    for path in sorted(output.parent.rglob("*.md")):
        if path.resolve() == output.resolve():
            continue
        text = path.read_text(errors="replace")
        date = re.search(r"^Written by `batchrl-benchmark` on (.+?) from ", text,
                         re.MULTILINE)
        if text.startswith("# Learning results") and date:
            found.append((path.relative_to(output.parent), date[1], earlier_sections(path)))
    return sorted(found, key=lambda report: report[1], reverse=True)


def summary_lines(sections, names, others=()):
    """The report's first table: per config, the first eval at or above its threshold
    beside its final eval, as its section's table has them (`section_figures`).

    Args:
      sections: dict config -> the lines of its section in this report.
      names: the configs to list besides those (`configs.available()`).
      others: `other_reports`, for the configs without a section here: the newest
        report with a table of the config gives its row, which names that report.

    Returns:
      the lines; "see its section (by hand)" for a section here without a table, "not
      measured" for a config without a table in any report.
    """
    lines = [
        "## First hit and final evaluation of every config", "",
        "Per config, as the table of its section has them (the median seed, or the only "
        "one): the steps of the first eval at or above its threshold, and the eval at the "
        "run's last step. A config's figure is its final eval: a first hit may not last "
        "(an eval return of 500 on CartPole can fall to 20 a few evals later). Configs "
        "without a section here take their row from the newest other report of "
        "`batchrl-benchmark` in this folder that has one (its runs may be of the config "
        "as it was then); *not measured*: no recorded run in any of them.", "",
        "| config | env | seeds | threshold | first step ≥ threshold | final step "
        "| final eval return | best eval return | report |",
        "|---|---|---|---|---|---|---|---|---|"]
    for name in sorted(set(names) | set(sections)):
        figures, where = None, "below"
        if name in sections:
            figures = section_figures(sections[name])
        else:
            for path, date, found in others:
                figures = section_figures(found[name]["lines"]) if name in found else None
                if figures is not None:
                    where = f"[{path.as_posix()}]({path.as_posix()}), {date}"
                    break
        if figures is not None:
            lines.append(
                f"| `{name}` | {figures['env']} | {figures['seeds']} | "
                f"{figures['threshold']} | {figures['steps_to_threshold']} | "
                f"{figures['final_step']} | {figures['final_return']} | "
                f"{figures['best_return']} | {where} |")
        else:
            note = "see its section (by hand)" if name in sections else "not measured"
            lines.append(f"| `{name}` | — | — | — | {note} | — | {note} | — | — |")
    return lines + [""]


def write_report(runs, thresholds, output, tag="mean_score", logdir=None, left_out=()):
    """Writes the Markdown report and one plot per config next to it.

    The sections of configs that have no runs in `runs` but a section in the report already
    at `output` are kept as they are, with a line saying so (runs/ does not outlive a
    machine, the report does) unless the config is in `left_out`; all sections go in the
    order of the config names.

    Args:
      runs: dict config -> {seed: run directory} (from `run_summary.discover`).
      thresholds: dict config -> threshold score; a config without one uses the Gymnasium
        `reward_threshold` of its environment, if any.
      output: the Markdown file; the plots go to its folder as CONFIG.png.
      left_out: configs whose runs exist but were filtered out of `runs` (`--configs`):
        their sections are kept without that line.

    Returns:
      the report's text.
    """
    output = pathlib.Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    kept = {config: section for config, section in earlier_sections(output).items()
            if config not in runs}
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        "# Learning results", "",
        f"Written by `batchrl-benchmark` on {now} from the runs under "
        f"`{logdir or 'the given folders'}` ({platform.node()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}).", "",
        "Eval return: the eval `mean_score`, the mean undiscounted return of the mean-action "
        "policy over `eval_episodes` episodes, after every `eval_every` training steps. Steps "
        "are training environment steps of all agents. Training seconds: wall-clock time "
        "from the start of training (graph tracing, updates, evaluations and checkpoints "
        "included; in parentheses, the part spent tracing and optimizing the step function "
        "before the first step); seconds from the command: from the launch of the training process "
        "(Python's and TensorFlow's start-up included). Hours are wall-clock time from the "
        "creation of the run's event files (pauses between resumed processes left out). "
        "Train steps/s: the train phases' steps over their wall-clock seconds (updates "
        "included, evaluation not), from the event files. The plots show the median and "
        "the 25th–75th percentiles over seeds, and each seed as a thin line.", ""]
    sections = {config: _kept_section(section, logdir, note=config not in left_out)
                for config, section in kept.items()}
    for config, seeds in runs.items():
        lines, before = [], lines
        read = [plot.read_run(path, tag) for path in seeds.values()]
        env = read[0].config.get("env", "?")
        threshold, source = thresholds.get(config), ""
        if threshold is None:
            threshold, source = env_threshold(env), " (Gymnasium's reward_threshold)"
        rows = [run_summary.summarize(run, threshold) for run in read]
        for row, seed in zip(rows, seeds, strict=True):
            row["seed"] = seed if row["seed"] is None else row["seed"]
        first = read[0]
        groups = plot.group_runs(read, [f"{config} ({env})"] * len(read))
        image = output.parent / f"{config}.png"
        try:
            plot.plot_groups(groups, image, tag, threshold=threshold,
                             title=f"{config} ({env}): {tag}, median and 25th–75th "
                                   f"percentiles over {len(seeds)} seed(s)")
            picture = f"![{config} learning curves]({image.name})"
        except ValueError as error:
            picture = f"(no plot: {error})"
        overrides = config_overrides(config, first.config)
        settings = ("overrides of `configs/" + config + ".yaml`: "
                    + (", ".join(f"`{item}`" for item in overrides) or "none")
                    if overrides is not None else "config file not found")
        threshold_text = (f"threshold {threshold:g}{source}" if threshold is not None
                          else "no threshold")
        lines += [
            f"## {config} ({env})", "",
            f"{len(seeds)} seed(s) in `{pathlib.Path(next(iter(seeds.values()))).parent}`; "
            f"{threshold_text}; {settings}.", ""]
        target = target_text(config, rows)
        if target:
            lines += [target, ""]
        notes = pathlib.Path(next(iter(seeds.values()))).parent / NOTES_NAME
        if notes.exists():  # What the runs themselves cannot say, e.g. how they were run.
            lines += [notes.read_text().strip(), ""]
        lines += [table(rows, threshold), picture, ""]
        sections[config], lines = lines, before
    if sections:
        lines += summary_lines(sections, configs.available(), other_reports(output))
    for config in sorted(sections):
        lines += sections[config]
    if not sections:
        lines += ["No runs found.", ""]
    text = "\n".join(lines)
    output.write_text(text)
    return text


def train_run(config, seed, path, sets):
    """Runs (or resumes) one training process, echoing its output into RUN_DIR/train.log.

    Returns:
      the process's exit code.
    """
    command = [sys.executable, "-m", "batchrl.scripts.train", f"--config={config}",
               f"--logdir={path}", "--no-progress", "--set", f"seed={seed}",
               *[item for pair in sets for item in ("--set", pair)]]
    path.mkdir(parents=True, exist_ok=True)
    environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    with open(path / run_summary.LOG_NAME, "a") as log:
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        log.write(f"# {started}\n# launched at {time.time():.3f}\n$ {' '.join(command)}\n")
        print("$", " ".join(command), flush=True)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=environ)
        try:
            for line in process.stdout:
                sys.stdout.write(line)
                log.write(line)
                log.flush()
            return process.wait()
        except KeyboardInterrupt:  # The child got the signal too and saves a checkpoint.
            process.wait()
            raise


def parse_thresholds(pairs):
    """`CONFIG=VALUE` strings over `DEFAULT_THRESHOLDS`: dict config -> float.

    Raises:
      ValueError: for a malformed pair.
    """
    thresholds = dict(DEFAULT_THRESHOLDS)
    for pair in pairs:
        match = re.fullmatch(r"\s*([^=\s]+)\s*=\s*(\S+)\s*", pair)
        try:
            thresholds[match[1]] = float(match[2])
        except (TypeError, ValueError):
            raise ValueError(f"--threshold expects CONFIG=VALUE, got {pair!r}") from None
    return thresholds


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m batchrl.scripts.benchmark",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", metavar="CONFIG",
                        help="config names under configs/ (default for --report-only: all "
                             "runs found)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="seeds (default: 0 1 2; for --report-only: all found)")
    parser.add_argument("--steps", type=int, help="override every config's steps")
    parser.add_argument("--threshold", action="append", default=[], metavar="CONFIG=VALUE",
                        help="the eval score to reach (repeatable; built in: "
                             + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_THRESHOLDS.items())
                             + "; otherwise Gymnasium's reward_threshold of the env, if any)")
    parser.add_argument("--logdir", default="runs/benchmark",
                        help="runs go to LOGDIR/CONFIG/seed-N (default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed on to every training command")
    parser.add_argument("--output", default="docs/results.md",
                        help="the report; plots go next to it (default: %(default)s)")
    parser.add_argument("--tag", default="mean_score", help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the report and plots from existing runs")
    quiet.add_verbose_flag(parser)
    args = parser.parse_args(argv)
    train.start_tensorflow(args.verbose)  # TensorBoard's event reader imports TensorFlow.
    try:
        thresholds = parse_thresholds(args.threshold)
    except ValueError as error:
        parser.error(str(error))

    if args.report_only:
        runs = run_summary.discover(args.logdir, args.configs, args.seeds)
        left_out = set(run_summary.discover(args.logdir)) - set(runs)
        write_report(runs, thresholds, args.output, args.tag, args.logdir, left_out)
        print(f"Wrote {args.output} ({sum(len(s) for s in runs.values())} runs).")
        return 0 if runs else 1

    if not args.configs:
        parser.error("--configs is required unless --report-only is given")
    seeds = args.seeds if args.seeds is not None else [0, 1, 2]
    sets = [*args.set, *([f"steps={args.steps}"] if args.steps is not None else [])]
    targets = {}
    try:
        if "seed" in configs.parse_overrides(sets):
            raise configs.ConfigError("give seeds with --seeds, not --set seed=...")
        for config in args.configs:
            if config not in configs.available():
                raise configs.ConfigError(
                    f"--configs takes names under configs/ ({', '.join(configs.available())})"
                    f", got {config!r}")
            targets[config] = configs.load(config, sets).steps
    except configs.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = []
    for seed in seeds:  # Seed-major: every config gets a first seed early.
        for config in args.configs:
            path = run_summary.run_dir(args.logdir, config, seed)
            step = run_summary.checkpoint_step(path)
            if step >= targets[config]:
                print(f"{path}: complete ({step:,} of {targets[config]:,} steps), skipped.")
                continue
            try:
                code = train_run(config, seed, path, sets)
            except KeyboardInterrupt:
                print(f"\nInterrupted; run the same command again to resume {path}.",
                      file=sys.stderr)
                return 130
            if code != 0:
                failed.append(f"{path} (exit code {code}; see {path / run_summary.LOG_NAME})")
            write_report(run_summary.discover(args.logdir), thresholds, args.output, args.tag,
                         args.logdir)
    runs = run_summary.discover(args.logdir)
    print(write_report(runs, thresholds, args.output, args.tag, args.logdir))
    print(f"Wrote {args.output}.")
    if failed:
        print("failed runs:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hyperparameter search for batchrl configs with Optuna: TPE sampler, pruning, SQLite.

    batchrl-tune --config pendulum \\
        --search policy_lr=log:1e-5:1e-3 --search update_epochs=int:5:30 \\
        --search batch_size=cat:4,8,16 --search discount=float:0.9:0.99 \\
        --trials 20 --seeds 0 1 --steps 40000 --jobs 2 --set eval_every=10000 \\
        --storage runs/tune/pendulum.db --study pendulum --output runs/tune/pendulum

Search spaces: `--search KEY=SPEC` (repeatable) or `--space FILE.yaml` (a mapping KEY: SPEC;
a YAML list there is a `cat` of its items). SPEC: `float:LOW:HIGH[:STEP]`, `log:LOW:HIGH`
(log-uniform), `int:LOW:HIGH[:STEP]` (both ends included) or `cat:A,B,...`, whose values
are the items of a YAML flow list: lists in brackets, strings with commas quoted
(`cat:null,50`, `cat:[64,64],[200,100]`). Every searched value (both ends of a range, each
cat value), --set key and --steps is checked with the config system before any trial
starts; a bad one ends with one error line and exit code 2.

A trial runs one training process per seed, all its seeds at once: `python -m
batchrl.scripts.train --config=CONFIG --logdir=OUTPUT/trial-N/seed-S --no-progress --set
seed=S --set KEY=VALUE...` (output in RUN_DIR/train.log). The eval scores are read from each
run's event files (the `mean_score` scalars in RUN_DIR/eval, polled every POLL_SECONDS while
the runs train), never from the printed output. At each eval step that every seed has
reached, the mean eval score goes to Optuna, and the pruner may stop the trial: its
processes get SIGTERM, save a checkpoint and exit. Up to --jobs trials run at once: up to
JOBS x SEEDS training processes.

Objective (maximized; the mean over seeds): `mean`, the mean of a run's eval scores (the
area under the learning curve: rewards fast learning); `final`, the last; `tail`, the mean
of the evals in the last quarter of the steps (the end of a run, less noisy than one eval);
`best`, the highest. --threshold V: minus the steps to the first eval score >= V (never: 2 x steps).

The study is kept in SQLite (--storage): the same command resumes it. Ctrl-C stops the
running trials' processes, marks those trials failed and exits with 130; trials left
RUNNING by a killed session are marked failed on resume; the study goes on until --trials
trials are complete or pruned. --enqueue-config makes trial 0 of a new study the config's
own values of the searched keys (each must lie in its space): the baseline that the other
trials are compared with, measured in the same study. After every trial OUTPUT/trials.md
(all trials) and OUTPUT/best.yaml (the best trial's config: the named config's keys, the
--set keys and the best values, for `python -m batchrl.scripts.train
--config=OUTPUT/best.yaml`) are rewritten. Run one tuner per study at a time.
"""

import argparse
import datetime
import json
import os
import pathlib
import queue
import shlex
import signal
import subprocess
import sys
import threading

import optuna
from optuna.trial import TrialState

from batchrl import configs
from batchrl.scripts import quiet, train
from batchrl.scripts.events import read_scalars
from batchrl.scripts.search_space import flow, parse_search, read_yaml, validate

OBJECTIVES = ("mean", "final", "tail", "best")
DONE = (TrialState.COMPLETE, TrialState.PRUNED)
TERMINATE_SECONDS = 60  # After SIGTERM, a training process gets this long to save and exit.
LOG_NAME = "train.log"
POLL_SECONDS = 0.5  # How often the event files of running trials are read.
EVAL_DIR, EVAL_TAG = "eval", "mean_score"  # Where the training command writes eval scores.


class TrialFailed(Exception):
    """A trial's training process failed, or a signal stopped the trial (marked FAIL)."""


def seed_objective(series, objective="mean", threshold=None, steps=None):
    """One seed's value from its `[(step, eval score), ...]`, sorted by step; `tail` and
    `threshold` need the run's `steps`."""
    values = [value for _, value in series]
    if threshold is not None:
        reached = [step for step, value in series if value >= threshold]
        return -float(reached[0] if reached else 2 * steps)
    if objective == "final":
        return values[-1]
    if objective == "tail":
        tail = [value for step, value in series if step >= 0.75 * steps] or values[-1:]
        return sum(tail) / len(tail)
    return max(values) if objective == "best" else sum(values) / len(values)


def _terminate(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()


def eval_scores(run_dir):
    """The eval scores that a training run has written so far: `{step: mean_score}` (int
    environment steps -> float return) from the event files in `run_dir/eval`; empty before
    the first eval (or without the folder). A record still being written is left for the
    next call."""
    directory = pathlib.Path(run_dir) / EVAL_DIR
    if not directory.is_dir():
        return {}
    return {scalar.step: scalar.value for scalar in read_scalars(directory, EVAL_TAG)}


def _read(process, seed, log_path, ends):
    """Echoes a process's output into its log; puts `(seed, exit code, last line)` into the
    queue `ends` when the process has ended."""
    last = "no output"
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(process.command)}\n")
        for line in process.stdout:
            log.write(line)
            log.flush()
            last = line.strip() or last
    ends.put((seed, process.wait(), last))


class Tuner:
    """The objective function of a study, its training processes (so that a signal stops
    them all) and its reports."""

    def __init__(self, args, base, params, sets, trainer):
        self.args, self.base, self.params, self.sets = args, base, params, sets
        self.trainer, self.output = trainer, pathlib.Path(args.output)
        self.lock, self.processes = threading.RLock(), set()
        self.stopping, self.signal = threading.Event(), None
        self.fatal = None  # A config error that the training command found.

    def start(self, logdir, seed, overrides):
        """Starts one training process (output piped); None once stopping."""
        command = [*self.trainer, f"--config={self.args.config}", f"--logdir={logdir}",
                   "--no-progress", "--set", f"seed={seed}",
                   *[item for key, value in overrides.items()
                     for item in ("--set", f"{key}={flow(value)}")]]
        logdir.mkdir(parents=True, exist_ok=True)
        environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        with self.lock:
            if self.stopping.is_set():
                return None
            process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, env=environ)
            self.processes.add(process)
        process.command = command
        return process

    def finish(self, processes):
        """SIGTERMs those of `processes` still running and waits (SIGKILL after a while)."""
        _terminate(processes)
        for process in processes:
            try:
                process.wait(TERMINATE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with self.lock:
                self.processes.discard(process)

    def stop_all(self, signum=None):
        """Stops the study: no new processes, SIGTERM to every running one."""
        with self.lock:
            self.signal = self.signal or signum
            self.stopping.set()
            running = list(self.processes)
        _terminate(running)

    def say(self, text):
        """Prints one line (threads take turns)."""
        with self.lock:
            print(text, flush=True)

    def __call__(self, trial):
        """Runs a trial, one process per seed; returns the mean over seeds or raises
        optuna.TrialPruned or TrialFailed (failed or interrupted)."""
        overrides = {param.key: param.suggest(trial) for param in self.params}
        trial.set_user_attr("overrides", overrides)
        self.say(f"[trial {trial.number}] start: {_params_text(overrides)} (seeds "
                 f"{' '.join(map(str, self.args.seeds))})")
        scores, processes, ends = {seed: {} for seed in self.args.seeds}, [], queue.Queue()
        logdirs = {seed: self.output / f"trial-{trial.number}" / f"seed-{seed}"
                   for seed in self.args.seeds}
        try:
            for seed, logdir in logdirs.items():
                process = self.start(logdir, seed, {**self.sets, **overrides})
                if process is not None:
                    processes.append(process)
                    threading.Thread(target=_read, daemon=True,
                                     args=(process, seed, logdir / LOG_NAME, ends)).start()
            outcome, last = self._follow(trial, logdirs, scores, ends, processes)
        finally:
            self.finish(processes)
        return self._conclude(trial, scores, outcome, last)

    def _follow(self, trial, logdirs, scores, ends, processes):
        """Reads the runs' eval event files every POLL_SECONDS until the processes end (and
        once after), reports means, prunes; returns the outcome (None, `("pruned", step)` or
        `("failed", message, exit code)`) and the last step reported."""
        reported, outcome, running = set(), None, len(processes)
        while running:
            try:
                ended = [ends.get(timeout=POLL_SECONDS)]
            except queue.Empty:
                ended = []
            while not ends.empty():
                ended.append(ends.get())
            outcome = self._poll(trial, logdirs, scores, reported, processes, outcome)
            for seed, code, last in ended:
                running -= 1
                if code != 0 and outcome is None and not self.stopping.is_set():
                    outcome = ("failed", f"seed {seed} exited with code {code}: {last}", code)
                    self.finish(processes)
        return outcome, max(reported, default=None)

    def _poll(self, trial, logdirs, scores, reported, processes, outcome):
        """Reads the new eval scores of every seed into `scores` (seed -> {step: score});
        reports the mean at each step that all seeds have reached to Optuna, unless the
        trial has an `outcome` already; returns the outcome (`("pruned", step)` once the
        pruner stops the trial, whose processes are then ended)."""
        for seed, logdir in logdirs.items():
            for step, value in sorted(eval_scores(logdir).items()):
                if step not in scores[seed]:
                    scores[seed][step] = value
                    self.say(f"[trial {trial.number}] seed {seed} step {step:,} eval "
                             f"{value:.1f}")
        common = set.intersection(*(set(series) for series in scores.values())) - reported
        for at in sorted(common) if outcome is None else ():
            mean = sum(series[at] for series in scores.values()) / len(scores)
            reported.add(at)
            if len(scores) > 1:
                self.say(f"[trial {trial.number}] step {at:,} mean eval {mean:.1f}")
            trial.report(mean, at)
            if trial.should_prune():
                outcome = ("pruned", at)
                self.finish(processes)
        return outcome

    def _fail(self, trial, message, stop=False):
        trial.set_user_attr("error", message)
        if stop:
            trial.study.stop()
        raise TrialFailed(message)

    def _conclude(self, trial, scores, outcome, last):
        """Stores the per-seed values; returns the objective or raises the trial's end."""
        if self.stopping.is_set():
            self._fail(trial, "interrupted", stop=True)
        if outcome and outcome[0] == "failed":
            if outcome[2] == 2:  # The training command's config error: stop the study.
                self.fatal = outcome[1]
                self.stop_all()
            self._fail(trial, outcome[1], stop=outcome[2] == 2)
        if not all(scores.values()):
            self._fail(trial, "no eval scores")
        values = {str(seed): seed_objective(sorted(series.items()), self.args.objective,
                                            self.args.threshold, self.base.steps)
                  for seed, series in scores.items()}
        trial.set_user_attr("seed_values", values)
        trial.set_user_attr("last_step", last)
        if outcome:
            raise optuna.TrialPruned(f"at step {outcome[1]:,}")
        return sum(values.values()) / len(values)

    def after_trial(self, study, trial):
        """Optuna callback: prints the trial's end; rewrites trials.md and best.yaml."""
        if trial.state == TrialState.COMPLETE:
            end = f"done: objective {trial.value:.6g} ({_seed_text(trial)})"
        elif trial.state == TrialState.PRUNED:
            end = f"pruned at step {trial.user_attrs.get('last_step', 0):,}"
        else:
            end = f"failed: {trial.user_attrs.get('error', 'see its train.log')}"
        self.say(f"[trial {trial.number}] {end} after {_minutes(trial):.1f} min "
                 f"({_count(study)} of {self.args.trials} done)")
        self.write_reports(study)

    def write_reports(self, study):
        """Writes OUTPUT/trials.md and OUTPUT/best.yaml; returns the best trial or None."""
        space = ", ".join(f"`{param.key}={param.describe()}`" for param in self.params)
        objective = (self.args.objective if self.args.threshold is None else
                     f"minus the steps to an eval score >= {self.args.threshold:g}")
        with self.lock:
            self.output.mkdir(parents=True, exist_ok=True)
            (self.output / "trials.md").write_text(
                f"# Study {study.study_name}\n\nConfig `{self.args.config}`, "
                f"{self.base.steps:,} steps, seeds {', '.join(map(str, self.args.seeds))}; "
                f"objective: {objective} (mean over seeds, maximized); search: {space}.\n\n"
                + trials_table(study))
            return write_best(study, self.args, self.sets, self.output / "best.yaml")


def _params_text(overrides):
    return ", ".join(f"{key}={value:.4g}" if isinstance(value, float) else
                     f"{key}={value if isinstance(value, str) else flow(value)}"
                     for key, value in overrides.items())


def _seed_text(trial):
    values = trial.user_attrs.get("seed_values", {})
    return ", ".join(f"seed {seed}: {value:.6g}" for seed, value in values.items())


def _minutes(trial):
    end = trial.datetime_complete or datetime.datetime.now()
    return (end - trial.datetime_start).total_seconds() / 60 if trial.datetime_start else 0.0


def _count(study, states=DONE):
    return len(study.get_trials(deepcopy=False, states=states))


def trials_table(study):
    """A Markdown table of the study's trials: number, state, params, objective, per-seed
    values, the last eval step and minutes."""
    lines = ["| trial | state | params | objective | per seed | last eval step | minutes |",
             "|---|---|---|---|---|---|---|"]
    for trial in study.get_trials(deepcopy=False):
        params = trial.user_attrs.get("overrides", trial.params)
        value = f"{trial.value:.6g}" if trial.state == TrialState.COMPLETE else "—"
        last = trial.user_attrs.get("last_step")
        lines.append(f"| {trial.number} | {trial.state.name.lower()} | "
                     f"{_params_text(params) or '—'} | {value} | {_seed_text(trial) or '—'} | "
                     f"{'—' if last is None else f'{last:,}'} | {_minutes(trial):.1f} |")
    return "\n".join(lines) + "\n"


def write_best(study, args, sets, path):
    """Writes the best complete trial's config to `path`, checked with `configs.load`;
    returns that `FrozenTrial`, or None (nothing written) while no trial is complete."""
    try:
        best = study.best_trial
    except ValueError:  # No complete trial yet.
        return None
    overrides = best.user_attrs.get("overrides", best.params)
    full = configs.load(args.config, {**sets, **overrides})
    named = (pathlib.Path(args.config) if os.sep in args.config or args.config.endswith(
        (".yaml", ".yml")) else configs.CONFIG_DIR / f"{args.config}.yaml")
    keys = set(read_yaml(named.read_text()) or {}) | set(sets) | set(overrides)
    objective = args.objective if args.threshold is None else "threshold"
    header = (f"# Study {study.study_name!r} (batchrl-tune), best trial {best.number}: "
              f"objective {objective} {best.value:.6g}\n# (the mean over seeds; "
              f"{_seed_text(best)}): config {args.config!r}, the --set keys, the best values."
              f"\n# python -m batchrl.scripts.train --config={path} --logdir=runs/best\n")
    path.write_text(header + configs.dump({key: full[key] for key in full if key in keys}))
    configs.load(str(path))
    return best


def open_study(storage_path, name, wanted, sampler_seed=0, pruner=None):
    """Creates or loads the study in SQLite, marks trials still RUNNING as FAIL; returns
    `(study, their numbers)`. Raises ConfigError when the study has other settings. The TPE
    sampler's seed is `sampler_seed` plus the trials in the study (a resumed study does not
    repeat the first session's trials)."""
    storage_path = pathlib.Path(storage_path)
    storage_path.parent.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{storage_path.resolve()}",
                                         engine_kwargs={"connect_args": {"timeout": 60}})
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize",
                                load_if_exists=True)
    saved = study.user_attrs.get("settings")
    if saved is None:
        study.set_user_attr("settings", wanted)
    elif saved != wanted:
        changed = "; ".join(f"{key}: {saved.get(key)!r} -> {wanted.get(key)!r}"
                            for key in sorted(set(saved) | set(wanted))
                            if saved.get(key) != wanted.get(key))
        raise configs.ConfigError(f"study {name!r} in {storage_path} has other settings "
                                  f"({changed}); use the same command or a new --study")
    stale = [trial.number for trial in study.get_trials(states=(TrialState.RUNNING,))]
    for number in stale:  # Left RUNNING by a killed session.
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    sampler = optuna.samplers.TPESampler(seed=sampler_seed + len(study.trials))
    return optuna.load_study(study_name=name, storage=storage, sampler=sampler,
                             pruner=pruner), stale


def make_pruner(kind, steps, eval_every, warmup=None, startup_trials=5):
    """`none`; `median`, after `startup_trials` finished trials and from step `warmup` on
    (default: past a quarter of `steps`); or `hyperband` (resources in environment steps)."""
    warmup = steps // 4 + 1 if warmup is None else warmup
    if kind == "none":
        return optuna.pruners.NopPruner()
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(eval_every, warmup, 1),
                                              max_resource=steps, reduction_factor=3)
    return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup)


def _parser():
    parser = argparse.ArgumentParser(prog="python -m batchrl.scripts.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--config", default="pendulum", help="a config name or YAML file (default: pendulum)")
    add("--search", action="append", default=[], metavar="KEY=SPEC",
        help="a searched key, e.g. policy_lr=log:1e-5:1e-3 (repeatable)")
    add("--space", metavar="FILE.yaml", help="searched keys from a YAML mapping KEY: SPEC")
    add("--set", action="append", default=[], metavar="KEY=VALUE",
        help="a config override of every trial, the value parsed as YAML (repeatable)")
    add("--trials", type=int, default=20, help="complete + pruned trials in all (default: 20)")
    add("--seeds", type=int, nargs="+", default=[0], help="seeds of a trial (default: 0)")
    add("--steps", type=int, help="training steps of every run (default: the config's)")
    add("--objective", choices=OBJECTIVES, default="mean",
        help="mean (area under the eval curve), final, tail (mean of the last quarter's "
        "evals) or best eval score (default: mean)")
    add("--threshold", type=float, help="instead: minus the steps to the first eval score >= "
        "THRESHOLD (not reached: 2 x steps)")
    add("--pruner", choices=("median", "hyperband", "none"), default="median",
        help="median stopping rule (default), Hyperband or none")
    add("--warmup", type=int, help="the first step at which the median pruner prunes, or "
        "Hyperband's first rung (default: past a quarter of the steps)")
    add("--startup-trials", type=int, default=5,
        help="finished trials before the median pruner prunes (default: 5)")
    add("--jobs", type=int, default=1, help="trials at once, at most the CPU count (default: 1)")
    add("--sampler-seed", type=int, default=0,
        help="the TPE sampler's seed; a study with --jobs 1 is repeatable (default: 0)")
    add("--enqueue-config", action="store_true",
        help="make the first trial of a new study the config's own values of the searched "
        "keys: a baseline in the same study")
    add("--study", help="the study's name (default: the config's name)")
    add("--storage", help="the SQLite file (default: OUTPUT/study.db)")
    add("--output", help="trial runs, trials.md, best.yaml (default: runs/tune/STUDY)")
    quiet.add_verbose_flag(parser)
    add("--trainer", default=f"{shlex.quote(sys.executable)} -m batchrl.scripts.train",
        help=argparse.SUPPRESS)  # Tests use a stand-in.
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    args.study = args.study or pathlib.Path(args.config).stem
    args.output = args.output or f"runs/tune/{args.study}"
    storage = args.storage or str(pathlib.Path(args.output) / "study.db")
    try:
        if not 1 <= args.jobs <= (os.cpu_count() or 1):
            raise configs.ConfigError(f"--jobs must be 1 to {os.cpu_count()}, got {args.jobs}")
        if args.trials < 1 or (args.steps or 1) < 1 or min(args.seeds) < 0 or len(
                set(args.seeds)) < len(args.seeds):
            raise configs.ConfigError("--trials and --steps must be positive, --seeds distinct "
                                      "and not negative")
        params = parse_search(args.search, args.space)
        if not params:
            raise configs.ConfigError("nothing to search: give --search KEY=SPEC or --space")
        sets = configs.parse_overrides(args.set)
        sets.update({} if args.steps is None else {"steps": args.steps})
        base = validate(args.config, sets, params)
        pruner = make_pruner(args.pruner, base.steps, base.eval_every, args.warmup,
                             args.startup_trials)
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        wanted = json.loads(json.dumps({  # What a resumed study must keep.
            "config": args.config, "set": sets, "seeds": args.seeds, "threshold": args.threshold,
            "objective": args.objective, "search": {p.key: p.describe() for p in params}}))
        baseline = {param.key: param.label(getattr(base, param.key))
                    for param in params} if args.enqueue_config else None
        study, stale = open_study(storage, args.study, wanted, args.sampler_seed, pruner)
        if baseline and not study.trials:
            study.enqueue_trial(baseline)
    except configs.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # TensorBoard's event reader imports TensorFlow: quietly, before the first trial.
    train.start_tensorflow(args.verbose)
    tuner = Tuner(args, base, params, sets, shlex.split(args.trainer))
    print(f"Study {args.study!r} in {storage}: {_count(study)} of {args.trials} trials done"
          + (f"; stale running trials {stale} marked failed" if stale else "") + ".", flush=True)
    code = _optimize(study, tuner, args)
    best = tuner.write_reports(study)
    print(trials_table(study) + (f"Best: trial {best.number}, objective {best.value:.6g}: "
          f"{_params_text(best.user_attrs['overrides'])}; see {args.output}/best.yaml."
          if best else f"No complete trial yet; see {args.output}/trials.md."))
    if code > 128:
        print(f"Interrupted: the running trials were stopped and marked failed. Run the same "
              f"command again to resume ({_count(study)} of {args.trials} done).",
              file=sys.stderr)
    return code


def _optimize(study, tuner, args):
    """Runs trials until `args.trials` are complete or pruned; returns 0, 1 (a round's
    trials all failed), 2 (the training command rejected the config) or 128 + a signal."""
    def on_signal(signum, frame):
        if tuner.stopping.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # A second Ctrl-C.
        threading.Thread(target=tuner.stop_all, args=(signum,), daemon=True).start()

    previous = {signum: signal.signal(signum, on_signal)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not tuner.stopping.is_set() and _count(study) < args.trials:
            remaining, before = args.trials - _count(study), _count(study)
            study.optimize(tuner, n_trials=remaining, n_jobs=min(args.jobs, remaining),
                           catch=(TrialFailed,), callbacks=[tuner.after_trial])
            if tuner.fatal:
                print(f"error: {tuner.fatal}", file=sys.stderr)
                return 2
            if _count(study) == before and not tuner.stopping.is_set():
                print("error: every trial of this round failed; see their train.log",
                      file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        tuner.stop_all(signal.SIGINT)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 + tuner.signal if tuner.stopping.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())

"""Inject random faults into short training runs and count what went wrong.

    .venv/bin/python -m benchmarks.faults --trials 20 \
        --output docs/faults.md --section "Worker processes"
    .venv/bin/python -m benchmarks.faults --backend ray --trials 20 \
        --output docs/faults.md --section "Ray actors"
    .venv/bin/python -m benchmarks.faults --backend envpool --trials 8 \
        --output docs/faults.md --section "EnvPool"
    .venv/bin/python -m benchmarks.faults --config pendulum_sac --trials 20 \
        --output docs/faults.md --section "SAC, worker processes"

With `--section TITLE` the report replaces the section `## TITLE` of the `--output` page
(or is appended as a new one) and leaves the rest of the page as it is: docs/faults.md
holds every trial set under its own heading.

Each trial trains Pendulum with `--config` (default `pendulum`: PPO) in worker processes
(with `--backend ray` Ray actors on a local Ray that the trainer starts; with `--backend
envpool` EnvPool's `envpool:Pendulum-v1` in the trainer's process), on a short schedule
(`FULL`: 8,000 steps; `--quick`, a smoke test: `QUICK`, 1,600), into a fresh run directory
and injects one fault, chosen at random:

- a worker fault at a random step (benchmarks/faults/envs.py): an exception (`raise`), an exit
  (`exit`), SIGKILL of the worker (`kill`), a hung worker (`hang`, with
  `worker_timeout` 5 s) or a NaN observation (`nan`); the run must end with exit code 1
  and one `error: training failed` message;
- an exception in the worker's environment outside `step`: in its constructor
  (`raise-init`) or in its k-th `reset` (`raise-reset`, k = 2-8, so mid-run: the first
  reset is when the batch is built); the run must end with exit code 1 and one `error:`
  message that names the environment;
- with `--backend ray` also `kill-restart`: SIGKILL of an actor at a random step with
  `worker_restarts: 1`; the run must finish (exit code 0) and log one restart;
- with `--backend envpool`, in place of the worker and environment faults above (EnvPool's
  environments are C++ in the trainer's process): bad actions given to the batch
  environment at a random step (benchmarks/faults/actions.py): NaN for environment 1
  (`nan-action`), or an action outside `Discrete(2)` for environment 1 of
  `envpool:CartPole-v1` (`bad-action`, config cartpole); the run must end with exit code
  1 and one `error: training failed` message naming environment 1 and the action, then
  the same command without the fault must resume from the latest checkpoint and finish;
  and `env_kwargs` that EnvPool cannot take (`bad-kwargs`: an unknown option or a bad
  `num_threads`, refused as config errors with exit code 2, or an option value EnvPool
  raises on, exit code 1); the run must end with one `error:` message and write nothing
  into the run directory;
- a signal to the trainer at a random time, 0-4 s (`--quick`: 0-1 s) after its first
  checkpoint: SIGINT or SIGTERM (exit code 130 / 143 and a checkpoint), or SIGKILL (no
  chance to clean up, possibly while a checkpoint is written); the same command is then run
  again and must resume and finish;
- SIGKILL of the trainer inside its N-th checkpoint write (`sigkill-save`): the trainer is
  run by benchmarks/faults/train.py, which stalls the write at a random stage (`shards`: data
  in the temporary files, `merged`: `ckpt-S.*` complete but the `checkpoint` index file not
  yet replaced, `sweep`: index replaced, old checkpoints half deleted); the files at the
  kill must show that stage, and the same command, run again, must resume from the
  checkpoint the index names and finish.

Counted over all trials: hangs (a run not finished within its time limit), leftover
processes (any process still carrying the trial's marker in its environment
`LEFTOVER_GRACE` seconds after the run, Ray's own processes included: after a SIGKILL of
the trainer, some of them take about a minute to exit; the detail says how long they took),
unreadable checkpoints (the latest checkpoint cannot be read), and resumed runs that lost
more than one checkpoint interval (the resumed step is more than `eval_every` behind the
last step the killed run reported).

The runs' settings follow the algorithm of `--config` (`settings`): a short on-policy
schedule for ppo, trpo and a2c; for sac and td3 a small replay memory saved with the latest
checkpoint (`save_replay: true`), and each trial that resumes must end with a memory that
holds every training step (`replay_kept`: one that restarted empty would hold only the steps
since the resume), counted as resumed runs that did not keep the replay memory. The
bad-action trial of an off-policy `--config` uses `cartpole_dqn` (Discrete actions).
"""

import argparse
import dataclasses
import functools
import pathlib
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import ROOT, child_environment
from benchmarks.faults import evidence
from benchmarks.faults.actions import AFTER_VARIABLE, KIND_VARIABLE
from benchmarks.faults.train import MARKER_VARIABLE, SAVE_VARIABLE, STAGE_VARIABLE, STAGES


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The length of the runs of a trial and the times of its faults.

    Attributes:
      steps: training steps of a run (`NUM_AGENTS` environments).
      eval_every: training steps between evaluations, each of which writes a checkpoint.
      max_length: the episodes' time limit, in steps.
      last_fault: a worker fault comes at a random step of one environment, an action
        fault at a random batch step, from 50 to this (3/4 of the run's batch steps).
      signal_delay: a signal comes at a random time up to this many seconds after the
        first checkpoint.
    """

    steps: int
    eval_every: int
    max_length: int
    last_fault: int
    signal_delay: float

    @property
    def saves(self):
        """Checkpoints a run writes (int)."""
        return self.steps // self.eval_every

    def settings(self):
        """The `--set` pairs of every run, whatever its algorithm (list of str)."""
        return ["--set", f"steps={self.steps}", "--set", f"eval_every={self.eval_every}",
                "--set", f"num_agents={NUM_AGENTS}", "--set", "eval_episodes=2", "--set",
                "worker_timeout=5", "--set", f"max_length={self.max_length}"]


NUM_AGENTS = 4
# The benchmark's runs, and those of `--quick` (a smoke test of every fault: the same
# faults reached in runs a fifth as long, with episodes of 20 steps).
FULL = Schedule(steps=8000, eval_every=1000, max_length=200, last_fault=1500,
                signal_delay=4.0)
QUICK = Schedule(steps=1600, eval_every=200, max_length=20, last_fault=300, signal_delay=1.0)
DEFAULT_CONFIG = "pendulum"
# The `--set` pairs of a run's algorithm family, after those of its `Schedule`: a short
# on-policy schedule, or a small replay memory saved with the latest checkpoint
# (`save_replay`), so that a resumed run keeps it.
ON_POLICY_SETTINGS = ["--set", "update_every=4", "--set", "update_epochs=2"]
# More than FULL.steps: the memory of a finished run holds every step.
REPLAY_CAPACITY = 20000
OFF_POLICY_SETTINGS = ["--set", "learning_starts=200", "--set",
                       f"replay_capacity={REPLAY_CAPACITY}", "--set", "save_replay=true"]
OFF_POLICY = ("sac", "td3", "dqn")  # Algorithms that learn from a replay memory.
DISCRETE_ONLY = ("dqn",)  # Algorithms without Box actions: they cannot act in Pendulum.
# The configs of the envpool action trials (nan-action: Box actions, bad-action: Discrete
# actions) for an on-policy --config; an off-policy one uses itself and DISCRETE_OFF_POLICY.
ON_POLICY_ACTION_CONFIGS = {"nan-action": "pendulum", "bad-action": "cartpole"}
DISCRETE_OFF_POLICY = "cartpole_dqn"
KEEP_CHECKPOINTS = 5  # The Loop's default `keep_checkpoints`.
ENV_NAME = "benchmarks.faults.envs:FaultyPendulum"
WORKER_FAULTS = ("raise", "exit", "kill", "hang", "nan")
ENV_FAULTS = ("raise-init", "raise-reset")
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
SAVE_FAULTS = ("sigkill-save",)
FAULT_KINDS = WORKER_FAULTS + ENV_FAULTS + tuple(SIGNALS) + SAVE_FAULTS
RESTART_FAULTS = ("kill-restart",)  # Only with --backend ray.
ACTION_FAULTS = ("nan-action", "bad-action")  # Only with --backend envpool.
KWARGS_FAULTS = ("bad-kwargs",)  # Only with --backend envpool.
# The faults after which the same command resumes and must finish.
RESUME_FAULTS = tuple(SIGNALS) + SAVE_FAULTS + ACTION_FAULTS
ENVPOOL_NAME = "envpool:Pendulum-v1"
# `env_kwargs` of the bad-kwargs trials: (value, exit code, part of the error message).
BAD_KWARGS = (("{bogus_option: 1}", 2, "has no option 'bogus_option'"),
              ("{num_threads: -3}", 2, "num_threads (option) must be an int >= 1"),
              ("{max_num_players: two}", 1, "cannot create the environments"))
BACKENDS = {"processes": ["--set", "env_backend=processes"], "ray": ["--set", "env_backend=ray"],
            "envpool": ["--set", "env_backend=envpool"]}
# The fault kinds of each backend (the default of --faults).
BACKEND_FAULTS = {
    "processes": FAULT_KINDS,
    "ray": FAULT_KINDS + RESTART_FAULTS,
    "envpool": ACTION_FAULTS + KWARGS_FAULTS + tuple(SIGNALS) + SAVE_FAULTS,
}
TIME_LIMIT = 180  # Seconds a run may take before it counts as hung.
# Seconds processes may take to exit after a run. After a SIGKILL of a trainer that had
# started a local Ray, Ray's reaper ends its GCS and raylet at once and the actors within
# seconds, but the raylet's two agents (ray::DashboardAgent, ray::RuntimeEnvAgent) notice
# their parent's death, then try to report it to the dead GCS: on the 2-core machine
# everything was gone 2-3 s after the SIGKILL in some trials and after about 60 s in
# others.
LEFTOVER_GRACE = 120.0


@functools.cache
def algorithm_of(config):
    """The config key `algorithm` of config `config` (a name under `configs/` or a path).

    Raises:
      ConfigError: the config cannot be loaded (`batchrl.configs.load`).
    """
    from batchrl import configs

    return configs.load(config).algorithm


def settings(config, schedule=FULL):
    """The options of every run of a trial with `config`: the `Schedule`'s settings, then
    `OFF_POLICY_SETTINGS` for an algorithm of `OFF_POLICY` or `ON_POLICY_SETTINGS` for
    another (the keys of one family are refused by the other's algorithms), then
    `--no-progress`. Returns a list of str."""
    family = OFF_POLICY_SETTINGS if algorithm_of(config) in OFF_POLICY else ON_POLICY_SETTINGS
    return [*schedule.settings(), *family, "--no-progress"]


def action_config(kind, config):
    """The config of an envpool action trial `kind` (`ACTION_FAULTS`) for the command's
    `config`: one with Box actions for nan-action, with Discrete actions for bad-action, of
    the same family (`ON_POLICY_ACTION_CONFIGS`; `config` itself or `DISCRETE_OFF_POLICY`
    when it is off-policy)."""
    if algorithm_of(config) not in OFF_POLICY:
        return ON_POLICY_ACTION_CONFIGS[kind]
    return config if kind == "nan-action" else DISCRETE_OFF_POLICY


def _command(logdir, env_args, config, module="batchrl.scripts.train", backend="processes",
             schedule=FULL):
    """The command line of a run of `config` into `logdir` with the extra options
    `env_args`."""
    return [sys.executable, "-m", module, f"--config={config}", f"--logdir={logdir}",
            *settings(config, schedule), *BACKENDS[backend], *env_args]


def _env_name(backend):
    """The environment of the trials that do not choose their own."""
    return ENVPOOL_NAME if backend == "envpool" else ENV_NAME


def _environment(trial):
    return child_environment(TF_CPP_MIN_LOG_LEVEL="2", **{evidence.MARKER: str(trial)})


def _count_leftovers(result, trial):
    """Adds the trial's processes left after `LEFTOVER_GRACE` seconds to `result`, and the
    longest wait for processes to exit (`exit_seconds`)."""
    start = time.monotonic()
    left = evidence.leftover_processes(trial, LEFTOVER_GRACE)
    result["leftover"] += len(left)
    result["left"] += [evidence.process_name(pid) for pid in left]
    result["exit_seconds"] = max(result.get("exit_seconds", 0.0), time.monotonic() - start)


def _run(command, env, kill_after=None, signum=None, logdir=None, marker=None):
    """Runs `command`; sends `signum` `kill_after` seconds after the run's first checkpoint,
    or as soon as the file `marker` exists.

    Returns `(returncode or None when hung, stdout, stderr, seconds)`.
    """
    start = time.time()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if marker is not None:
        while (process.poll() is None and not marker.exists()
               and time.time() - start < TIME_LIMIT):
            time.sleep(0.05)
        if process.poll() is None and marker.exists():
            process.send_signal(signum)
    elif kill_after is not None:
        while (process.poll() is None and not (logdir / "checkpoint").exists()
               and time.time() - start < TIME_LIMIT):
            time.sleep(0.1)
        time.sleep(kill_after)
        if process.poll() is None:
            process.send_signal(signum)
    try:
        stdout, stderr = process.communicate(timeout=TIME_LIMIT)
        return process.returncode, stdout, stderr, time.time() - start
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        return None, stdout, stderr, time.time() - start


def _last_step(stdout):
    steps = [int(s.replace(",", "")) for s in re.findall(r"^step\s+([\d,]+)", stdout, re.M)]
    return max(steps, default=0)


def _resumed_step(stdout):
    match = re.search(r"\(step ([\d,]+)\)", stdout)
    return int(match.group(1).replace(",", "")) if match else 0


def _error_detail(stderr):
    """The `error:` lines of `stderr`, and a summary for the report's detail column."""
    error = [line for line in stderr.splitlines() if line.startswith("error:")]
    if error:
        return error, error[0][:120]
    uncaught = re.findall(r"^[\w.]+(?:Error|Exception)\b.*", stderr, re.M)
    return error, "no error line" + (f"; uncaught {uncaught[0][:120]}" if uncaught else "")


def trial(index, kind, rng, workdir, backend="processes", config=DEFAULT_CONFIG,
          schedule=FULL):
    """Runs one trial of fault `kind` with `config` (a config name or path) on `schedule`;
    returns a dict describing what happened. With an off-policy `config`, a trial that
    resumes must also end with the replay memory of every step (`replay_kept`; key
    `replay_lost`)."""
    logdir = pathlib.Path(workdir) / f"trial-{index:02d}"
    env = _environment(index)
    command = functools.partial(_command, config=config, backend=backend, schedule=schedule)
    result = {"trial": index, "fault": kind, "hung": False, "leftover": 0, "left": [],
              "unreadable": False, "lost_interval": False, "ok": False, "detail": ""}
    if kind in RESTART_FAULTS:
        after = rng.randint(50, schedule.last_fault)
        once = pathlib.Path(workdir) / f"trial-{index:02d}.killed"
        env_args = ["--set", f"env={ENV_NAME}", "--set", "worker_restarts=1", "--set",
                    f"env_kwargs={{fault: kill, after: {after}, once: '{once}'}}"]
        code, stdout, stderr, seconds = _run(command(logdir, env_args), env)
        result["hung"] = code is None
        restarts = stderr.count("restarted it as a new Ray actor")
        result["ok"] = code == 0 and once.exists() and restarts == 1
        result["detail"] = (f"SIGKILL of an actor after {after} env steps: exit {code}, "
                            f"{seconds:.0f} s, {restarts} restart(s) logged, last step "
                            f"{_last_step(stdout):,}"
                            + ("" if code == 0 else f"; {_error_detail(stderr)[1]}"))
    elif kind in WORKER_FAULTS or kind in ENV_FAULTS:
        if kind in WORKER_FAULTS:
            after = rng.randint(50, schedule.last_fault)
            where = f"after {after} env steps"
        elif kind == "raise-reset":
            after = rng.randint(2, 8)
            where = f"in reset call {after}"
        else:
            after = 0
            where = "in the constructor"
        env_args = ["--set", f"env={ENV_NAME}",
                    "--set", f"env_kwargs={{fault: {kind}, after: {after}}}"]
        code, _, stderr, seconds = _run(command(logdir, env_args), env)
        result["hung"] = code is None
        error, summary = _error_detail(stderr)
        expected = "training failed" if kind in WORKER_FAULTS else ENV_NAME
        result["ok"] = code == 1 and len(error) == 1 and expected in error[0]
        result["detail"] = f"{where}: exit {code}, {seconds:.0f} s; {summary}"
    elif kind in ACTION_FAULTS:
        result.update(_action_trial(kind, rng, logdir, env, backend, config, schedule))
    elif kind in KWARGS_FAULTS:
        kwargs, expected_code, expected = rng.choice(BAD_KWARGS)
        env_args = ["--set", f"env={ENVPOOL_NAME}", "--set", f"env_kwargs={kwargs}"]
        code, _, stderr, seconds = _run(command(logdir, env_args), env)
        result["hung"] = code is None
        error, summary = _error_detail(stderr)
        written = sorted(path.name for path in logdir.iterdir()) if logdir.exists() else []
        result["ok"] = (code == expected_code and len(error) == 1 and expected in error[0]
                        and not written)
        result["detail"] = (f"env_kwargs {kwargs}: exit {code}, {seconds:.0f} s; {summary}; "
                            f"files written: {', '.join(written) or 'none'}")
    elif kind in SAVE_FAULTS:
        result.update(_save_trial(index, rng, workdir, logdir, env, backend, config,
                                  schedule))
    else:
        delay = rng.uniform(0.0, schedule.signal_delay)
        env_args = ["--set", f"env={_env_name(backend)}"]
        code, stdout, stderr, seconds = _run(command(logdir, env_args), env, delay,
                                             SIGNALS[kind], logdir)
        result["hung"] = code is None
        # The step the run stopped at, or the last one it reported (after a checkpoint).
        stopped = re.search(r"Stopped at step ([\d,]+)", stderr)
        reached = int(stopped.group(1).replace(",", "")) if stopped else _last_step(stdout)
        _count_leftovers(result, index)
        result["unreadable"] = not evidence.checkpoint_readable(logdir)
        resumed_code, resumed_out, resumed_err, more = _run(command(logdir, env_args), env)
        result["hung"] |= resumed_code is None
        resumed_at = _resumed_step(resumed_out)
        result["lost_interval"] = reached - resumed_at > schedule.eval_every
        expected = {"sigint": 128 + signal.SIGINT, "sigterm": 128 + signal.SIGTERM,
                    "sigkill": -signal.SIGKILL}[kind]
        finished = resumed_code == 0
        result["ok"] = (code == expected or code == 0) and finished
        result["detail"] = (f"signal {delay:.1f} s after the first checkpoint: exit {code}, "
                            f"stopped or reported step {reached:,}, resumed at "
                            f"{resumed_at:,}, resumed run exit {resumed_code} ({more:.0f} s)"
                            + ("" if finished else f"; {resumed_err.strip()[-200:]}"))
    if kind in RESUME_FAULTS and algorithm_of(config) in OFF_POLICY:
        kept, description = evidence.replay_kept(logdir, REPLAY_CAPACITY)
        result["replay_lost"] = not kept
        result["ok"] = result["ok"] and kept
        result["detail"] += f"; {description}"
    _count_leftovers(result, index)
    result["unreadable"] |= not evidence.checkpoint_readable(logdir)
    if result["exit_seconds"] >= 1.0:
        result["detail"] += f"; the run's processes took {result['exit_seconds']:.0f} s to exit"
    if result["leftover"]:
        result["detail"] += (f"; {result['leftover']} process(es) left "
                             f"({', '.join(result['left'])})")
    return result


def _action_trial(kind, rng, logdir, env, backend, config, schedule):
    """A `nan-action` or `bad-action` trial (with `action_config(kind, config)`): bad actions
    at a random step (exit code 1), then the same command without the fault, which must
    resume from the latest checkpoint and finish."""
    after = rng.randint(50, schedule.last_fault)
    fault, name, expected = (
        ("nan", ENVPOOL_NAME, "non-finite action") if kind == "nan-action" else
        ("bad", "envpool:CartPole-v1", "outside the action space Discrete(2)"))
    command = _command(logdir, ["--set", f"env={name}"], action_config(kind, config),
                       module="benchmarks.faults.actions", backend=backend, schedule=schedule)
    faulty = dict(env, **{KIND_VARIABLE: fault, AFTER_VARIABLE: str(after)})
    code, stdout, stderr, seconds = _run(command, faulty)
    error, summary = _error_detail(stderr)
    failed = (code == 1 and len(error) == 1 and "error: training failed" in error[0]
              and "env 1 " in error[0] and expected in error[0])
    result = {"hung": code is None, "unreadable": not evidence.checkpoint_readable(logdir)}
    latest = evidence.step_of(evidence.checkpoint_index(logdir)[0])
    reached = _last_step(stdout)
    resumed_code, resumed_out, resumed_err, more = _run(command, env)
    result["hung"] |= resumed_code is None
    resumed_at = _resumed_step(resumed_out)
    result["lost_interval"] = reached - resumed_at > schedule.eval_every
    finished = resumed_code == 0
    result["ok"] = failed and finished and resumed_at == latest
    result["detail"] = (
        f"{fault} action for env 1 of {name} in batch step {after}: exit {code}, "
        f"{seconds:.0f} s; {summary}; last reported step {reached:,}, resumed at "
        f"{resumed_at:,} (latest checkpoint {latest:,}), resumed run exit {resumed_code} "
        f"({more:.0f} s)" + ("" if finished else f"; {resumed_err.strip()[-200:]}"))
    return result


def _save_trial(index, rng, workdir, logdir, env, backend, config, schedule):
    """A `sigkill-save` trial: SIGKILL inside a checkpoint write, then the same command."""
    stage = rng.choice(STAGES)
    save = rng.randint(KEEP_CHECKPOINTS + 1 if stage == "sweep" else 2, schedule.saves)
    marker = pathlib.Path(workdir) / f"trial-{index:02d}.stalled"
    stalling = dict(env, **{STAGE_VARIABLE: stage, SAVE_VARIABLE: str(save),
                            MARKER_VARIABLE: str(marker)})
    command = _command(logdir, ["--set", f"env={_env_name(backend)}"], config,
                       module="benchmarks.faults.train", backend=backend, schedule=schedule)
    code, stdout, _, seconds = _run(command, stalling, signum=signal.SIGKILL, marker=marker)
    result = {"hung": code is None, "leftover": 0, "left": [],
              "unreadable": not evidence.checkpoint_readable(logdir)}
    _count_leftovers(result, index)
    if not marker.exists():
        result["detail"] = (f"stage {stage} of save {save}: the run never got there "
                            f"(exit {code}, {seconds:.0f} s)")
        return result
    name = pathlib.Path(marker.read_text().strip()).name
    seen, files = evidence.write_stage_seen(logdir, name, stage)
    latest, _ = evidence.checkpoint_index(logdir)
    reached = _last_step(stdout)
    # The same command, without the stall.
    resumed_code, resumed_out, resumed_err, more = _run(command, env)
    result["hung"] |= resumed_code is None
    resumed_at = _resumed_step(resumed_out)
    result["lost_interval"] = reached - resumed_at > schedule.eval_every
    stray = evidence.stray_files(logdir)
    finished = resumed_code == 0
    result["ok"] = (code == -signal.SIGKILL and seen and finished
                    and resumed_at == evidence.step_of(latest))
    result["detail"] = (
        f"SIGKILL in stage {stage} of save {save} ({name}), {seconds:.0f} s: "
        f"{'' if seen else 'NOT mid-write: '}{files}; exit {code}, last reported step "
        f"{reached:,}, resumed at {resumed_at:,}, resumed run exit {resumed_code} "
        f"({more:.0f} s); stray files after it: {', '.join(stray) or 'none'}"
        + ("" if finished else f"; {resumed_err.strip()[-200:]}"))
    return result


def report(results):
    rows = ["| trial | fault | ok | detail |", "|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['trial']} | {r['fault']} | {'yes' if r['ok'] else 'NO'} | "
                    f"{r['detail']} |")
    totals = {
        "trials": len(results),
        "hangs": sum(r["hung"] for r in results),
        "leftover processes": sum(r["leftover"] for r in results),
        "unreadable checkpoints": sum(r["unreadable"] for r in results),
        "resumed runs that lost more than one checkpoint interval":
            sum(r["lost_interval"] for r in results),
        "trials with an unexpected outcome": sum(not r["ok"] for r in results),
    }
    if any("replay_lost" in r for r in results):  # Off-policy runs that resumed.
        totals["resumed runs that did not keep the replay memory"] = sum(
            r.get("replay_lost", False) for r in results)
    summary = "\n".join(f"- {name}: {value}" for name, value in totals.items())
    return summary + "\n\n" + "\n".join(rows) + "\n", totals


def with_section(page, title, body):
    """The Markdown `page` (str) with its section `## title` (from that heading to the next
    `## ` heading or the end) replaced by `body` under the same heading, or with the section
    appended when the page has none of that title."""
    section = f"## {title}\n\n{body.rstrip()}\n"
    match = re.search(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", page, re.MULTILINE | re.DOTALL)
    if match is None:
        return page.rstrip() + "\n\n" + section
    following = "\n" if match.end() < len(page) else ""
    return page[:match.start()] + section + following + page[match.end():]


def main(argv=None):
    """Runs the trials of `argv` (default: `sys.argv[1:]`) and prints the report; returns
    the exit code (1 when a count is not zero or a trial had an unexpected outcome)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20,
                        help="number of trials: the first ones take each fault kind once, "
                             "the others one drawn at random (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the choice of faults and their timing "
                             "(default: %(default)s)")
    parser.add_argument("--backend", choices=list(BACKENDS), default="processes",
                        help="where the environments run: ParallelBatchEnv worker processes, "
                             "Ray actors on a local Ray (env_backend: ray), or EnvPool in the "
                             "trainer's process (env_backend: envpool) "
                             "(default: %(default)s)")
    all_faults = list(dict.fromkeys(kind for kinds in BACKEND_FAULTS.values()
                                    for kind in kinds))
    parser.add_argument("--faults", nargs="+", default=None, choices=all_faults,
                        metavar="FAULT",
                        help="the fault kinds to draw from (default: all of the backend's: "
                             + "; ".join(f"{backend}: {' '.join(kinds)}"
                                         for backend, kinds in BACKEND_FAULTS.items()) + ")")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="the config of the runs (a name under configs/ or a path), with "
                             "Box actions; the settings follow its algorithm: a short "
                             "schedule for ppo, trpo and a2c, a small replay memory saved "
                             "with the latest checkpoint for sac and td3 (default: "
                             "%(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test: runs of {QUICK.steps:,} steps (not "
                             f"{FULL.steps:,}), an eval and checkpoint every "
                             f"{QUICK.eval_every}, episodes of {QUICK.max_length} steps, "
                             f"faults at steps 50-{QUICK.last_fault}, signals up to "
                             f"{QUICK.signal_delay:g} s after the first checkpoint")
    parser.add_argument("--output", help="also write the Markdown report to this file")
    parser.add_argument("--section", metavar="TITLE",
                        help="with --output: write the report as the section '## TITLE' of "
                             "that page, replacing a section of that title, keeping the rest")
    args = parser.parse_args(argv)
    try:
        algorithm = algorithm_of(args.config)
    except ValueError as error:  # ConfigError.
        parser.error(f"--config {args.config}: {error}")
    if algorithm in DISCRETE_ONLY:
        parser.error(f"--config {args.config}: algorithm {algorithm} acts only in Discrete "
                     f"action spaces; the trials train Pendulum (Box actions)")
    if args.faults is None:
        args.faults = list(BACKEND_FAULTS[args.backend])
    foreign = [kind for kind in args.faults if kind not in BACKEND_FAULTS[args.backend]]
    if foreign:
        parser.error(f"--backend {args.backend} has no fault {', '.join(foreign)}; its "
                     f"faults: {' '.join(BACKEND_FAULTS[args.backend])}")
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="batchrl-faults-") as workdir:
        for index in range(args.trials):
            kind = args.faults[index % len(args.faults)] if index < len(args.faults) \
                else rng.choice(args.faults)
            results.append(trial(index, kind, rng, workdir, args.backend, args.config,
                                 QUICK if args.quick else FULL))
            print(f"trial {index:2d} {kind:12s} {'ok' if results[-1]['ok'] else 'NOT OK'}  "
                  f"{results[-1]['detail']}", flush=True)
    text, totals = report(results)
    print("\n" + text)
    if args.output:
        written = ("Written by `python -m benchmarks.faults "
                   f"{shlex.join(sys.argv[1:] if argv is None else argv)}`.\n\n" + text)
        path = pathlib.Path(args.output)
        if args.section:
            page = path.read_text() if path.exists() else "# Fault injection\n"
            path.write_text(with_section(page, args.section, written))
        else:
            path.write_text("# Fault injection\n\n" + written)
    bad = sum(value for name, value in totals.items() if name != "trials")
    return 1 if bad else 0

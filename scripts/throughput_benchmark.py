"""Environment steps per second of batchrl's stepping paths, side by side with baselines.

    .venv/bin/python scripts/throughput_benchmark.py            # or: make bench
    .venv/bin/python scripts/throughput_benchmark.py --envs Pendulum-v1 --sizes 8 32 \\
        --seconds 3 --json /tmp/perf.json --output /tmp/perf.md
    .venv/bin/python scripts/throughput_benchmark.py --quick --json /tmp/q.json \\
        --output /tmp/q.md                                     # smoke test, ~1-2 minutes

For every environment id (`--envs`) and every batch size (`--sizes`) it measures, in one
run and one process, environment steps per second (every environment's step counts) of:

- `single_env`: one environment (built with `batchrl.scripts.environments.create`) stepped
  in a plain Python loop, reset when its episode ends: the per-core reference. Times
  `os.cpu_count()` it is the machine's core limit (the limit if stepping were perfectly
  parallel and free of overhead).
- `single_env_per_core`: the same loop in `os.cpu_count()` processes at once, their steps
  summed: the core limit as the machine gives it now (less than the above when the host's
  cores are shared with other virtual machines).
- `batch_env` / `batch_env_processes` / `parallel_batch_env`: `BatchEnv` in-process with
  blocking calls (as training builds it for `env_processes: false`), `BatchEnv` of one
  `ExternalProcess` worker per environment stepped with non-blocking calls, and
  `ParallelBatchEnv` (as training builds it for `env_processes: true`: one worker per core,
  each hosting a group of the environments, shared memory). Random valid actions; the
  environments whose episode ended are reset with `reset(indices)`.
- `sync_vector_env` / `async_vector_env`: Gymnasium's `SyncVectorEnv` and
  `AsyncVectorEnv` (forkserver workers, shared memory) of the same environments, random
  actions sampled from the vector action space. Autoreset is Gymnasium 1.x's default
  (`NEXT_STEP`): the call after an episode ended resets that environment instead of
  stepping it; such reset-only entries are not counted as steps.
- `simulate_mock` / `simulate_mock_loop` / `simulate_mock_processes`:
  `batchrl.tools.simulate` with `MockAlgorithm` (random actions) through the training
  loop's step function (`batchrl.tools.loop.step_function`): in-process with one step per
  `tf.function` call and with K (`--steps-per-call`) steps per call, and with the worker
  `ParallelBatchEnv` that training starts for `env_processes: true`, K steps per call.
- `ppo_inference`: the same with BatchPPO (`batchrl.scripts.agent.build` from the config of
  the environment, e.g. `pendulum` or `cheetah`, with `num_agents` overridden and
  in-process environments), `is_training` false: the mean action, nothing recorded; K
  steps per call.
- `ppo_training`: the same with `is_training` true and the config's update schedule,
  summaries written as in training; the wall time includes the PPO updates. The timed
  window starts with new episodes for all agents and an empty memory and, once the time
  budget is over, runs on until the end of the next update (at least `--min-updates`), so
  that it spans whole collect-and-update cycles.

An in-graph environment (`batchrl.envs:Pendulum`, batch sizes `--native-sizes`) gets
`single_env` of its Gymnasium equivalent and `simulate_mock_loop` (compiled with XLA),
`ppo_inference` and `ppo_training`, all K steps per call.

The goals compared with a baseline of the same process (`GOALS`) are then measured once
more with both sides timed in alternating windows of 0.25 s for `--pair-seconds` seconds
(`measure_paired`): the host's speed drifts over seconds, and a pair of adjacent windows
sees the same machine.

Then, for each of `--learning-seeds`, the training command trains `pendulum_native`
(BatchPPO on the in-graph Pendulum) for `--learning-steps` steps, and the report gives the
wall-clock seconds until its eval return first reached -200 (`measure_learning`).

Each measurement builds its environments (the setup time is reported), warms up for
`--warmup` seconds (at least two calls; the first `tf.function` call, which traces, is part
of the warm-up), then counts the steps of `--seconds` seconds of wall-clock time, and closes
everything it started. Ratios are taken against baselines of the same run: the single
environment (per core), the core limit, and per row a baseline named in `BASELINES` (e.g.
`simulate_mock` against `batch_env`, `simulate_mock_processes` and `parallel_batch_env`
against `async_vector_env`). Absolute figures drift between runs and with other load on
the machine: compare ratios within one run.

Writes a JSON file (`--json`, default docs/performance.json) and a Markdown report
(`--output`, default docs/performance.md) with the machine, the date, the command, the
goals of the throughput work (`GOALS`) with their measured figures, every figure and the
ratios, and the learning runs. TensorFlow is imported only by the measurements that need it, so
that worker processes importing this module stay light.
"""

import argparse
import contextlib
import dataclasses
import datetime
import functools
import itertools
import json
import multiprocessing
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np

from batchrl.scripts import configs, environments
from batchrl.tools import wrappers
from batchrl.tools.batch_env import BatchEnv

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Before anything imports TensorFlow.

# Measurement kinds, in report order, with their descriptions.
KINDS = {
    "single_env": "1 env, plain Python loop (per-core reference)",
    "single_env_per_core": "1 env per core, plain Python loops in `os.cpu_count()` processes "
                           "at once (the core limit, measured)",
    "batch_env": "BatchEnv, in-process (blocking)",
    "batch_env_processes": "BatchEnv, one ExternalProcess worker per env (non-blocking)",
    "parallel_batch_env": "ParallelBatchEnv, one worker per core hosting several envs, "
                          "shared memory",
    "sync_vector_env": "Gymnasium SyncVectorEnv",
    "async_vector_env": "Gymnasium AsyncVectorEnv (forkserver)",
    "simulate_mock": "simulate + MockAlgorithm, in-process BatchEnv, 1 step per call",
    "simulate_mock_loop": "simulate + MockAlgorithm, in-process (an in-graph env: XLA), "
                          "K steps per call",
    "simulate_mock_processes": "simulate + MockAlgorithm, ParallelBatchEnv as training "
                               "makes it (`env_processes: true`), K steps per call",
    "ppo_inference": "simulate + BatchPPO inference (is_training false), K steps per call",
    "ppo_training": "simulate + BatchPPO training, updates included, K steps per call",
}

# The baseline of each batched kind: the same environments and batch size, same run.
BASELINES = {
    "batch_env": "sync_vector_env",
    "batch_env_processes": "async_vector_env",
    "parallel_batch_env": "async_vector_env",
    "simulate_mock": "batch_env",
    "simulate_mock_loop": "batch_env",
    "simulate_mock_processes": "async_vector_env",
    "ppo_inference": "simulate_mock_loop",
    "ppo_training": "ppo_inference",
}

# The config that BatchPPO is built from, per environment id (see `config_name`).
CONFIG_NAMES = {"Pendulum-v1": "pendulum", "HalfCheetah-v5": "cheetah",
                "batchrl.envs:Pendulum": "pendulum_native"}

DEFAULTS = dict(envs=["Pendulum-v1", "HalfCheetah-v5", "batchrl.envs:Pendulum"],
                sizes=[8, 32, 128], native_sizes=[32, 4096], steps_per_call=100, seconds=2.0,
                warmup=1.0, min_updates=1, repeats=5, inter_op_threads=None,
                learning_seeds=[0, 1, 2], learning_steps=400_000, pair_seconds=20.0)
QUICK = dict(envs=["Pendulum-v1", "HalfCheetah-v5", "batchrl.envs:Pendulum"], sizes=[2, 4],
             native_sizes=[4], steps_per_call=3, seconds=0.3, warmup=0.1, min_updates=0,
             repeats=1, inter_op_threads=None, learning_seeds=[], learning_steps=400_000,
             pair_seconds=0.0)

# The learning measurement (`measure_learning`): BatchPPO on the in-graph Pendulum, the
# wall-clock time until the first eval return >= the threshold.
LEARNING_CONFIG = "pendulum_native"
LEARNING_THRESHOLD = -200.0

# Comparisons timed in alternating windows (`measure_paired`, `run_pairs`): the goals'
# ratios, and the processes kind against the core limit as the machine gives it.
PAIRS = [
    ("Pendulum-v1", 32, "simulate_mock_loop", "batch_env"),
    ("HalfCheetah-v5", 32, "simulate_mock_processes", "single_env"),
    ("HalfCheetah-v5", 32, "simulate_mock_processes", "single_env_per_core"),
]

# The goals of the throughput work (issue 4), checked in the report. `measure` is a row's
# field (`vs_baseline`, `steps_per_second`) of the row `(env, kind, num_envs)`; `paired`,
# the median ratio of `kind` to `baseline` timed in alternating windows (`measure_paired`;
# against `single_env`, divided by `os.cpu_count()`: a ratio to the core limit); or
# `seconds_to_threshold` of the learning runs (every seed must be below the target).
GOALS = [
    dict(what="`simulate` + MockAlgorithm, Pendulum-v1, 32 envs in-process, K steps per "
              "call, vs raw `batch_env` stepping (paired windows)",
         env="Pendulum-v1", num_envs=32, measure="paired", kind="simulate_mock_loop",
         baseline="batch_env", target=0.8),
    dict(what="`simulate` + MockAlgorithm, HalfCheetah-v5, 32 envs in worker processes, K "
              "steps per call, vs Gymnasium `async_vector_env` stepping alone",
         env="HalfCheetah-v5", num_envs=32, measure="vs_baseline",
         kind="simulate_mock_processes", target=1.5),
    dict(what="the same, vs the 2-core raw limit (paired windows with one environment in "
              "a plain loop, times 2)",
         env="HalfCheetah-v5", num_envs=32, measure="paired", kind="simulate_mock_processes",
         baseline="single_env", target=0.7),
    dict(what="`simulate` + MockAlgorithm, in-graph Pendulum, 4,096 envs (XLA): steps/s",
         env="batchrl.envs:Pendulum", num_envs=4096, measure="steps_per_second",
         kind="simulate_mock_loop", target=1_000_000),
    dict(what=f"BatchPPO on the in-graph Pendulum (`{LEARNING_CONFIG}`): wall-clock seconds "
              f"from the training command's start to the first eval return >= "
              f"{LEARNING_THRESHOLD:g}, every seed",
         measure="seconds_to_threshold", target=120.0),
]

# Random actions are drawn once, before timing, and cycled through.
ACTION_POOL = 64
# Environment steps per timed call in the single-environment loop (keeps the clock cheap).
SINGLE_ENV_CHUNK = 32


@dataclasses.dataclass
class Measurement:
    """One timed run.

    Attributes:
      kind: a key of `KINDS`.
      env: the Gymnasium id.
      num_envs: the batch size (1 for `single_env`).
      steps: environment steps in the timed window (every environment's step counts).
      seconds: wall-clock seconds of the timed window.
      calls: timed calls (batch steps; `SINGLE_ENV_CHUNK` steps each for `single_env`).
      setup_seconds: wall-clock seconds to build the environments (and agent), before the
        warm-up.
      updates: PPO updates inside the timed window (`ppo_training` only, else None).
      samples: steps per second of every repeat of this measurement, in the order they ran,
        when it was repeated (`run_benchmark`); this one is the median repeat.
    """

    kind: str
    env: str
    num_envs: int
    steps: int
    seconds: float
    calls: int
    setup_seconds: float
    updates: int | None = None
    samples: tuple = ()

    @property
    def steps_per_second(self):
        """Environment steps per wall-clock second (float)."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass
class PairedMeasurement:
    """`kind` against `baseline`, timed in alternating short windows (`measure_paired`).

    Attributes:
      kind, baseline: keys of `KINDS`.
      env: the Gymnasium id.
      num_envs: the batch size of `kind` (the baseline's too, but 1 for `single_env`).
      ratios: steps/s of `kind` over steps/s of `baseline`, one per pair of adjacent
        windows (tuple of floats).
      steps_per_second, baseline_steps_per_second: over all windows of each.
      setup_seconds: building both, before the warm-up.
    """

    kind: str
    baseline: str
    env: str
    num_envs: int
    ratios: tuple
    steps_per_second: float
    baseline_steps_per_second: float
    setup_seconds: float

    @property
    def ratio(self):
        """The median of `ratios` (float)."""
        return float(np.median(self.ratios))


# Helpers.


def _warm_up(call, warmup):
    """Calls `call()` at least twice and for at least `warmup` wall-clock seconds."""
    call()
    call()
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        call()


def _window(call, seconds):
    """Calls `call()` until `seconds` have passed (the last call is finished); returns
    `(steps, elapsed seconds, calls)`."""
    steps = calls = 0
    start = time.perf_counter()
    while True:
        steps += call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps, elapsed, calls


def _run_timed(call, seconds, warmup):
    """Calls `call()` for `warmup` seconds (at least twice), then for `seconds` seconds.

    Args:
      call: zero-argument callable returning the environment steps it took (int).
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `(steps, elapsed, calls)` of the timed part: environment steps, wall-clock seconds
      (at least `seconds`; the last call is finished), calls.
    """
    _warm_up(call, warmup)
    return _window(call, seconds)


def _action_pool(space, shape, seed=0):
    """`ACTION_POOL` random actions of `space`, each reshaped to `shape` (a batch or one).

    Args:
      space: a Gymnasium space; actions are drawn with `space.sample()` (uniform within a
        bounded `Box`, uniform among the choices of a `Discrete`).
      shape: None to keep `space`'s samples, else the batch size `B`: samples of the single
        environment's space are stacked to `[B, *action_shape]`.

    Returns:
      list of `ACTION_POOL` actions (NumPy arrays or scalars).
    """
    space.seed(seed)
    if shape is None:
        return [space.sample() for _ in range(ACTION_POOL)]
    return [np.stack([space.sample() for _ in range(shape)]) for _ in range(ACTION_POOL)]


def env_config(env_id, num_envs, processes):
    """The default config for `env_id` with `num_envs` agents (`configs.Config`).

    Raises:
      ConfigError: an unknown environment id.
    """
    config = configs.load("default", {"env": env_id, "num_agents": num_envs,
                                      "env_processes": processes})
    environments.check_env_id(env_id)
    return config


def config_name(env_id):
    """The config BatchPPO is built from for `env_id`: `CONFIG_NAMES`, else the first
    shipped config (sorted by name) whose `env` is `env_id`, else `default`."""
    if env_id in CONFIG_NAMES:
        return CONFIG_NAMES[env_id]
    for name in configs.available():
        if configs.load(name).env == env_id:
            return name
    return "default"


@contextlib.contextmanager
def _batch_env(config):
    """The config's batch (as training builds it), closed on exit; yields
    `(batch_env, setup_seconds)`."""
    start = time.perf_counter()
    batch_env = environments.create_batch(config)
    try:
        yield batch_env, time.perf_counter() - start
    finally:
        batch_env.close()


def _step_function(batch_env, algo, steps_per_call, writer=None, step=None,
                   jit_compile=False):
    """The training loop's step function (`batchrl.tools.loop.step_function`)."""
    from batchrl.tools.loop import step_function

    return step_function(batch_env, algo, steps_per_call, writer, step,
                         jit_compile=jit_compile)


def _simulate_call(function, batch, steps_per_call):
    """A `_run_timed` call: one full step function call without logging or forced reset;
    returns the environment steps it took."""
    import tensorflow as tf

    false, count = tf.constant(False), tf.constant(steps_per_call)

    def call():
        done, _ = function(false, false, count)
        done.numpy()
        return batch * steps_per_call

    return call


# Measurements: one function per kind.


@contextlib.contextmanager
def _single_env_stepper(env_id):
    """One environment (built with `environments.create`; for an in-graph environment its
    Gymnasium equivalent), stepped with random actions and reset when its episode ends;
    closed on exit. Yields `(call, setup_seconds)`: `call()` takes `SINGLE_ENV_CHUNK` steps
    and returns that number."""
    start = time.perf_counter()
    env = environments.create(environments.gymnasium_id(env_id))
    setup = time.perf_counter() - start
    try:
        actions = itertools.cycle(_action_pool(env.action_space, None))
        env.reset(seed=0)

        def call():
            step, reset = env.step, env.reset
            for _ in range(SINGLE_ENV_CHUNK):
                _, _, terminated, truncated, _ = step(next(actions))
                if terminated or truncated:
                    reset()
            return SINGLE_ENV_CHUNK

        yield call, setup
    finally:
        env.close()


# A process of `single_env_per_core`: steps one environment as `single_env` does for the
# seconds read from each line of its input, and answers with the steps taken.
_LOOP_WORKER = """
import sys
sys.path.insert(0, {scripts!r})
import throughput_benchmark as benchmark
with benchmark._single_env_stepper({env_id!r}) as (call, _):
    print("ready", flush=True)
    for line in sys.stdin:
        steps, _, _ = benchmark._window(call, float(line))
        print(steps, flush=True)
"""

# Seconds of one call of `single_env_per_core`'s stepper (all processes step this long).
PER_CORE_SLICE = 0.05


@contextlib.contextmanager
def _single_env_per_core_stepper(env_id):
    """`os.cpu_count()` processes, each stepping one environment in a plain loop as
    `single_env` does, all at the same time; ended on exit. Yields `(call, setup_seconds)`:
    `call()` lets every process step for `PER_CORE_SLICE` seconds and returns the steps
    they took together."""
    start = time.perf_counter()
    code = _LOOP_WORKER.format(scripts=str(pathlib.Path(__file__).resolve().parent),
                               env_id=env_id)
    processes = []
    try:
        for _ in range(os.cpu_count() or 1):
            processes.append(subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, bufsize=1, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")))
        for process in processes:
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a single_env_per_core process for {env_id} failed to "
                                   f"start (exit code {process.wait()})")
        command = f"{PER_CORE_SLICE}\n"

        def call():
            for process in processes:
                process.stdin.write(command)
            return sum(int(process.stdout.readline()) for process in processes)

        yield call, time.perf_counter() - start
    finally:
        for process in processes:
            with contextlib.suppress(OSError):
                process.stdin.close()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure_single_env_per_core(env_id, seconds, warmup):
    """Steps one environment per core in a plain Python loop, `os.cpu_count()` processes
    at the same time: the core limit as the machine gives it now (the single environment's
    rate times `os.cpu_count()` assumes full, unshared cores).

    Args:
      env_id: as for `measure_single_env`.
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `Measurement` of kind `single_env_per_core` (`num_envs`: the processes), in
      environment steps per second of all processes together.
    """
    with _single_env_per_core_stepper(env_id) as (call, setup):
        steps, elapsed, calls = _run_timed(call, seconds, warmup)
    return Measurement("single_env_per_core", env_id, os.cpu_count() or 1, steps, elapsed,
                       calls, setup)


def measure_single_env(env_id, seconds, warmup):
    """Steps one environment in a plain Python loop, random actions, reset when its episode
    ends (terminated or truncated by the time limit).

    Args:
      env_id: a Gymnasium id; for an in-graph environment (`batchrl.envs:Pendulum`) its
        Gymnasium equivalent is stepped (the reference that the in-graph one replaces).
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `Measurement` of kind `single_env`: environment steps per second of one core.
    """
    with _single_env_stepper(env_id) as (call, setup):
        steps, elapsed, calls = _run_timed(call, seconds, warmup)
    return Measurement("single_env", env_id, 1, steps, elapsed, calls, setup)


@contextlib.contextmanager
def _external_batch_env(config):
    """A `BatchEnv` of one `ExternalProcess` worker per environment (non-blocking calls),
    seeded like `environments.create_batch`, closed on exit; yields `(batch_env,
    setup_seconds)`."""
    start = time.perf_counter()
    constructor = functools.partial(environments.create, config.env,
                                    environments.episode_limit(config))
    workers = []
    try:
        for index in range(config.num_agents):
            workers.append(wrappers.ExternalProcess(constructor, name=f"env {index}"))
        batch_env = BatchEnv(workers, blocking=False)
        batch_env.reset(seed=config.seed)
        yield batch_env, time.perf_counter() - start
    finally:
        for worker in workers:
            worker.close()


@contextlib.contextmanager
def _batch_env_stepper(env_id, num_envs, kind):
    """A batch of `kind` (see `measure_batch_env`) stepped from Python with random valid
    actions, the environments whose episode ended reset with `reset(indices)`; closed on
    exit. Yields `(call, setup_seconds)`: `call()` takes one batch step and returns
    `num_envs`."""
    if kind == "batch_env_processes":
        batch = _external_batch_env(env_config(env_id, num_envs, True))
    elif kind in ("batch_env", "parallel_batch_env"):
        batch = _batch_env(env_config(env_id, num_envs, kind == "parallel_batch_env"))
    else:
        raise ValueError(f"not a batch kind: {kind!r}")
    with batch as (batch_env, setup):
        actions = itertools.cycle(_action_pool(batch_env.action_space, num_envs))

        def call():
            _, _, terminated, truncated, _ = batch_env.step(next(actions))
            done = terminated | truncated
            if done.any():
                batch_env.reset(np.flatnonzero(done))
            return num_envs

        yield call, setup


def measure_batch_env(env_id, num_envs, kind, seconds, warmup):
    """Steps a batch of environments from Python with random valid actions; the
    environments whose episode ended are reset with `reset(indices)`.

    Args:
      env_id: a Gymnasium id.
      num_envs: the batch size.
      kind: `batch_env` (in-process `BatchEnv`, blocking calls), `batch_env_processes`
        (`BatchEnv` of one `ExternalProcess` worker per environment, non-blocking calls) or
        `parallel_batch_env` (`ParallelBatchEnv` with one worker per core).
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `Measurement` of `kind`, in environment steps per second of the whole batch.
    """
    with _batch_env_stepper(env_id, num_envs, kind) as (call, setup):
        steps, elapsed, calls = _run_timed(call, seconds, warmup)
    return Measurement(kind, env_id, num_envs, steps, elapsed, calls, setup)


def measure_gymnasium_vector(env_id, num_envs, asynchronous, seconds, warmup):
    """Steps Gymnasium's `SyncVectorEnv` or `AsyncVectorEnv` with random actions from the
    vector action space.

    The environments are built like batchrl builds them (`environments.create`: time limit,
    actions in [-1, 1], float32 observations). Autoreset is Gymnasium 1.x's `NEXT_STEP`:
    after an episode ended, the next call resets that environment (its action is ignored);
    these reset-only entries are not counted as steps. `AsyncVectorEnv` starts its workers
    with `forkserver` (never `fork`: this process may have TensorFlow loaded) and uses
    shared memory for the observations.

    Args:
      env_id: a Gymnasium id.
      num_envs: the number of environments.
      asynchronous: True for `AsyncVectorEnv` (one worker process per environment), False
        for `SyncVectorEnv`.
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `Measurement` of kind `async_vector_env` or `sync_vector_env`, in environment steps
      per second of all environments.
    """
    limit = environments.episode_limit(env_config(env_id, num_envs, False))
    constructors = [functools.partial(environments.create, env_id, limit)] * num_envs
    start = time.perf_counter()
    if asynchronous:
        kind = "async_vector_env"
        # Workers start like batchrl's: without this script as their __main__.
        with wrappers.starting_workers(multiprocessing.get_context("forkserver")):
            envs = gym.vector.AsyncVectorEnv(constructors, context="forkserver")
    else:
        kind = "sync_vector_env"
        envs = gym.vector.SyncVectorEnv(constructors)
    try:
        envs.reset(seed=0)
        setup = time.perf_counter() - start
        actions = itertools.cycle(_action_pool(envs.action_space, None))
        autoreset = np.zeros(num_envs, bool)

        def call():
            nonlocal autoreset
            _, _, terminated, truncated, _ = envs.step(next(actions))
            stepped = num_envs - int(autoreset.sum())
            autoreset = np.logical_or(terminated, truncated)
            return stepped

        steps, elapsed, calls = _run_timed(call, seconds, warmup)
    except BaseException:
        envs.close(terminate=True)  # Workers may be mid-step: do not wait for them.
        raise
    envs.close()
    return Measurement(kind, env_id, num_envs, steps, elapsed, calls, setup)


def measure_simulate_mock(env_id, num_envs, processes, steps_per_call, seconds, warmup):
    """Steps `simulate` with `MockAlgorithm` (random valid actions) through the training
    loop's step function (`batchrl.tools.loop.step_function`).

    The batch is built as training builds it (`environments.create_batch`). An in-graph
    environment (`batchrl.envs`) runs with `jit_compile=True`: the whole call is one XLA
    computation.

    Args:
      env_id: a Gymnasium id, or an in-graph environment (`batchrl.envs:Pendulum`).
      num_envs: the batch size.
      processes: False for in-process environments, True for worker processes.
      steps_per_call: batch steps per `tf.function` call.
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up (includes the trace), in wall-clock seconds.

    Returns:
      `Measurement` of kind `simulate_mock` (1 step per call, in-process),
      `simulate_mock_loop` (more, in-process) or `simulate_mock_processes`, in environment
      steps per second of the whole batch.
    """
    if processes:
        kind = "simulate_mock_processes"
    else:
        kind = "simulate_mock" if steps_per_call == 1 else "simulate_mock_loop"
    with _simulate_mock_stepper(env_id, num_envs, processes, steps_per_call) as (call, setup):
        steps, elapsed, calls = _run_timed(call, seconds, warmup)
    return Measurement(kind, env_id, num_envs, steps, elapsed, calls, setup)


@contextlib.contextmanager
def _simulate_mock_stepper(env_id, num_envs, processes, steps_per_call):
    """`simulate` with `MockAlgorithm` as `measure_simulate_mock` runs it; the batch is
    closed on exit. Yields `(call, setup_seconds)`: `call()` runs one full call of the
    step function and returns its environment steps."""
    from batchrl.tools.in_graph_batch_env import InGraphBatchEnv
    from batchrl.tools.mock_algorithm import MockAlgorithm

    native = environments.native_class(env_id) is not None
    with _batch_env(env_config(env_id, num_envs, processes)) as (batch_env, setup):
        start = time.perf_counter()
        in_graph = batch_env if native else InGraphBatchEnv(batch_env)
        function = _step_function(in_graph, MockAlgorithm(in_graph, seed=0), steps_per_call,
                                  jit_compile=native)
        setup += time.perf_counter() - start
        yield _simulate_call(function, num_envs, steps_per_call), setup


def _agent_config(env_id, num_envs, overrides):
    """BatchPPO's config for `env_id` (in-process environments) and the module that builds
    the agent (imported here: it imports TensorFlow)."""
    from batchrl.scripts import agent as agent_lib

    config = configs.load(config_name(env_id), {
        "env": env_id, "num_agents": num_envs, "env_processes": False, **(overrides or {})})
    agent_lib.check(config)
    return config, agent_lib


def measure_ppo_inference(env_id, num_envs, steps_per_call, seconds, warmup, overrides=None):
    """Steps `simulate` with BatchPPO acting (mean action), learning off.

    The agent is built with `batchrl.scripts.agent.build` from the environment's config
    (`config_name`) with `num_agents` overridden and in-process environments.

    Args:
      env_id: a Gymnasium id.
      num_envs: the batch size (`num_agents`).
      steps_per_call: batch steps per `tf.function` call.
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up (includes the trace), in wall-clock seconds.
      overrides: optional dict of further config overrides.

    Returns:
      `Measurement` of kind `ppo_inference`, in environment steps per second.
    """
    config, agent_lib = _agent_config(env_id, num_envs, overrides)
    with _batch_env(config) as (batch_env, setup):
        start = time.perf_counter()
        agent = agent_lib.build(config, batch_env)
        agent.is_training.assign(False)
        agent.should_log.assign(False)
        function = _step_function(agent.batch_env, agent.algo, steps_per_call)
        setup += time.perf_counter() - start
        steps, elapsed, calls = _run_timed(
            _simulate_call(function, num_envs, steps_per_call), seconds, warmup)
    return Measurement("ppo_inference", env_id, num_envs, steps, elapsed, calls, setup)


def measure_ppo_training(env_id, num_envs, steps_per_call, seconds, warmup, min_updates=1,
                         max_seconds=600.0, overrides=None):
    """Trains BatchPPO through `simulate` (sampled actions, learning on, the config's update
    schedule, summaries to a temporary directory as in training); updates are timed too.

    The agent is built as in `measure_ppo_inference`. The warm-up (which traces) runs with
    learning off, so the timed window starts with an empty memory; its first call begins
    new episodes for all agents. Summaries are logged every `log_every` steps, as the
    training loop does. Once `seconds` have passed, the window runs on until the end of the
    call that completes an update (and at least `min_updates` updates), so that it spans
    whole collect-and-update cycles; with `min_updates=0` it ends after `seconds`.

    Args:
      env_id: a Gymnasium id.
      num_envs: the batch size (`num_agents`).
      steps_per_call: batch steps per `tf.function` call.
      seconds: the minimal timed budget, in wall-clock seconds.
      warmup: the untimed warm-up (includes the trace), in wall-clock seconds.
      min_updates: the minimal number of PPO updates in the timed window.
      max_seconds: the window ends after this many wall-clock seconds in any case (then
        possibly with fewer than `min_updates` updates, or not at an update's end).
      overrides: optional dict of further config overrides (e.g. a shorter schedule).

    Returns:
      `Measurement` of kind `ppo_training`, in environment steps per second including the
      updates; `updates` is the number of PPO updates in the timed window.
    """
    import tensorflow as tf

    config, agent_lib = _agent_config(env_id, num_envs, overrides)
    with (_batch_env(config) as (batch_env, setup),
          tempfile.TemporaryDirectory(prefix="batchrl-bench-") as logdir):
        start = time.perf_counter()
        agent = agent_lib.build(config, batch_env)
        writer = tf.summary.create_file_writer(logdir)
        function = _step_function(agent.batch_env, agent.algo, steps_per_call, writer,
                                  agent.step)
        iterations = agent.algo.checkpoint_state["policy_optimizer"].iterations
        setup += time.perf_counter() - start
        # Warm-up with learning off: traces, and leaves the memory empty.
        agent.is_training.assign(False)
        agent.should_log.assign(False)
        _warm_up(_simulate_call(function, num_envs, steps_per_call), warmup)
        agent.is_training.assign(True)
        agent.should_log.assign(True)
        true, false = tf.constant(True), tf.constant(False)
        count = tf.constant(steps_per_call)
        adam_steps = int(iterations.numpy())
        steps = calls = updates = 0
        next_log = config.log_every
        reset = true
        start = time.perf_counter()
        end, deadline = start + seconds, start + max(seconds, max_seconds)
        try:
            while True:
                after = steps + num_envs * steps_per_call
                log = after >= next_log
                while next_log <= after:
                    next_log += config.log_every
                done, _ = function(true if log else false, reset, count)
                reset = false
                steps = after
                calls += 1
                updated = False
                if done.numpy().any():  # Updates happen only when episodes end.
                    now_steps = int(iterations.numpy())
                    updated, adam_steps = now_steps != adam_steps, now_steps
                    updates += updated
                now = time.perf_counter()
                if now >= end and (min_updates <= 0 or updated and updates >= min_updates):
                    break
                if now >= deadline:
                    break
        finally:
            writer.close()
    return Measurement("ppo_training", env_id, num_envs, steps, now - start, calls, setup,
                       updates)


def measure_learning(seed, steps, logdir, config=LEARNING_CONFIG,
                     threshold=LEARNING_THRESHOLD):
    """Trains `config` with `seed` for `steps` steps with the training command (`python -m
    batchrl.scripts.train`, a new process, as a user runs it) in `logdir/seed-SEED`, and
    reads when its eval return first reached `threshold`.

    Args:
      seed: int, the config's `seed`.
      steps: int, the config's `steps` (training environment steps of the run).
      logdir: folder for the run directory (which must not hold a run of another config).
      config: a config name or path.
      threshold: the eval return (`mean_score` of the eval phases) to reach.

    Returns:
      dict with `seed`, `steps` (of the run), `command_seconds` (the whole command),
      `seconds_to_threshold` (from the command's start, TensorFlow's import, tracing and
      evaluations included, to the eval summary that first reached `threshold`),
      `training_seconds_to_threshold` (the same from the start of training, the eval's
      `time/training_seconds`, as in docs/results.md), `steps_to_threshold` (None for
      the three when not reached), `final_return` and `best_return`.

    Raises:
      RuntimeError: the training command failed (its last output is in the message).
    """
    import learning_benchmark
    import plot

    from batchrl.scripts.events import read_scalars

    run_dir = pathlib.Path(logdir) / f"seed-{seed}"
    command = [sys.executable, "-m", "batchrl.scripts.train", f"--config={config}",
               f"--logdir={run_dir}", "--no-progress", "--set", f"seed={seed}",
               "--set", f"steps={steps}"]
    start = time.time()
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    command_seconds = time.time() - start
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed (exit code {result.returncode}):\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")
    summary = learning_benchmark.summarize(plot.read_run(run_dir), threshold)
    scores = read_scalars(run_dir / "eval", "mean_score")
    reached = [scalar.wall_time for scalar in scores if scalar.value >= threshold]
    return {
        "seed": seed, "steps": steps, "command_seconds": command_seconds,
        "seconds_to_threshold": reached[0] - start if reached else None,
        "training_seconds_to_threshold": summary["seconds_to_threshold"],
        "steps_to_threshold": summary["steps_to_threshold"],
        "final_return": summary["final_return"], "best_return": summary["best_return"],
    }


def _stepper(kind, env_id, num_envs, steps_per_call):
    """The context manager that yields `(call, setup_seconds)` for `kind`."""
    if kind == "single_env":
        return _single_env_stepper(env_id)
    if kind == "single_env_per_core":
        return _single_env_per_core_stepper(env_id)
    if kind in ("batch_env", "batch_env_processes", "parallel_batch_env"):
        return _batch_env_stepper(env_id, num_envs, kind)
    if kind in ("simulate_mock_loop", "simulate_mock_processes"):
        return _simulate_mock_stepper(env_id, num_envs, kind == "simulate_mock_processes",
                                      steps_per_call)
    raise ValueError(f"kind {kind!r} cannot be paired")


def measure_paired(env_id, num_envs, kind, baseline, steps_per_call, seconds, warmup,
                   window=0.25):
    """Measures `kind` against `baseline` in alternating windows of `window` seconds.

    The machine's speed drifts over seconds (other virtual machines share the host); two
    measurements taken one after the other can differ by more than what they compare. Here
    both are built and warmed up in one process, then timed in turns, `kind` first in every
    other pair, and each pair of adjacent windows gives one ratio: a slow spell hits both
    sides of a ratio alike.

    Args:
      env_id: a Gymnasium id.
      num_envs: the batch size of `kind` and of `baseline` (`single_env` has one).
      kind, baseline: kinds of `_stepper` (`single_env`, `batch_env`,
        `batch_env_processes`, `parallel_batch_env`, `simulate_mock_loop`,
        `simulate_mock_processes`).
      steps_per_call: batch steps per call of the `simulate_mock_` kinds.
      seconds: the timed budget of all windows together, in wall-clock seconds.
      warmup: the untimed warm-up of each, in wall-clock seconds.
      window: seconds of one window (at least one call).

    Returns:
      `PairedMeasurement`.
    """
    with (_stepper(kind, env_id, num_envs, steps_per_call) as (call, setup),
          _stepper(baseline, env_id, num_envs, steps_per_call) as (base_call, base_setup)):
        _warm_up(call, warmup)
        _warm_up(base_call, warmup)
        ratios, totals = [], {kind: [0, 0.0], baseline: [0, 0.0]}
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or not ratios:
            turns = [(kind, call), (baseline, base_call)]
            rates = {}
            for name, function in turns if len(ratios) % 2 == 0 else turns[::-1]:
                steps, elapsed, _ = _window(function, window)
                rates[name] = steps / elapsed
                totals[name][0] += steps
                totals[name][1] += elapsed
            ratios.append(rates[kind] / rates[baseline])
    return PairedMeasurement(kind, baseline, env_id, num_envs, tuple(ratios),
                             totals[kind][0] / totals[kind][1],
                             totals[baseline][0] / totals[baseline][1], setup + base_setup)


# The benchmark and its report.


def run_benchmark(envs, sizes, seconds, warmup, min_updates=1, max_train_seconds=600.0,
                  log=print, native_sizes=(32, 4096), steps_per_call=100, repeats=1,
                  inter_op_threads=None, own_inter_op_threads=None):
    """Runs every measurement for every environment id and batch size.

    With `repeats` > 1 the measurements of one environment and batch size run in
    `repeats` rounds, one of each kind per round, so that slow drifts of the machine's
    speed hit every kind alike; each kind's result is its median repeat (its `samples`
    hold every repeat's steps/s). The single environment is repeated likewise, first.

    Args:
      envs: Gymnasium ids and in-graph environments (`batchrl.envs:Pendulum`).
      sizes: batch sizes of Gymnasium environments.
      seconds, warmup: the timed budget and the warm-up of each measurement, in seconds.
      min_updates, max_train_seconds: see `measure_ppo_training`.
      log: callable receiving one line of progress per measurement.
      native_sizes: batch sizes of in-graph environments; only the kinds that apply to
        them are measured (`single_env` of the Gymnasium equivalent, `simulate_mock_loop`,
        `ppo_inference`, `ppo_training`).
      steps_per_call: K, the batch steps per `tf.function` call of the `_loop`,
        `_processes` and `ppo_` kinds.
      repeats: int >= 1, the rounds of each group of measurements.
      inter_op_threads: TensorFlow's inter-op threads for every measurement; None for
        those training would use for the measurement's config
        (`batchrl.scripts.train.inter_op_threads`: 1 for in-process Gymnasium
        environments, else 0).
      own_inter_op_threads: the inter-op threads of this process's TensorFlow, already
        set; a measurement that needs others runs in a new process (`_isolated`). None:
        never start one (for callers that do not care).

    Returns:
      list of `Measurement`s, one per kind, environment and batch size.
    """
    results = []

    def run_group(measures):
        """Runs `repeats` rounds of the zero-argument `measures`; records the medians."""
        runs = [[] for _ in measures]
        for round_ in range(repeats):
            for measure, kind_runs in zip(measures, runs, strict=True):
                measurement = measure()
                kind_runs.append(measurement)
                extra = (f", {measurement.updates} updates"
                         if measurement.updates is not None else "")
                counter = f" [{round_ + 1}/{repeats}]" if repeats > 1 else ""
                log(f"{measurement.env:>21} {measurement.num_envs:>4} {measurement.kind:<24}"
                    f"{measurement.steps_per_second:>12,.0f} steps/s  (setup "
                    f"{measurement.setup_seconds:.1f} s{extra}){counter}")
        for kind_runs in runs:
            ranked = sorted(kind_runs, key=lambda m: m.steps_per_second)
            median = ranked[(len(ranked) - 1) // 2]
            samples = tuple(m.steps_per_second for m in kind_runs) if repeats > 1 else ()
            results.append(dataclasses.replace(median, samples=samples))

    timing = dict(seconds=seconds, warmup=warmup)
    training = dict(min_updates=min_updates, max_seconds=max_train_seconds, **timing)

    def partial(measure, env_id, size, *args, processes=False, **kwargs):
        """`measure(env_id, size, *args, **kwargs)` as a zero-argument callable, in a new
        process when its TensorFlow needs other inter-op threads than this one's."""
        from batchrl.scripts import train

        threads = inter_op_threads
        if threads is None:
            threads = train.inter_op_threads(env_config(env_id, size, processes))
        if own_inter_op_threads is None or threads == own_inter_op_threads:
            return functools.partial(measure, env_id, size, *args, **kwargs)
        return functools.partial(_isolated, measure, threads, env_id, size, *args, **kwargs)
    for env_id in envs:
        run_group([functools.partial(measure_single_env, env_id, **timing),
                   functools.partial(measure_single_env_per_core, env_id, **timing)])
        if environments.native_class(env_id):
            for size in native_sizes:
                run_group([
                    partial(measure_simulate_mock, env_id, size, False, steps_per_call,
                            **timing),
                    partial(measure_ppo_inference, env_id, size, steps_per_call, **timing),
                    partial(measure_ppo_training, env_id, size, steps_per_call, **training),
                ])
            continue
        for size in sizes:
            run_group([
                *(partial(measure_batch_env, env_id, size, kind, **timing)
                  for kind in ("batch_env", "batch_env_processes", "parallel_batch_env")),
                partial(measure_gymnasium_vector, env_id, size, False, **timing),
                partial(measure_gymnasium_vector, env_id, size, True, **timing),
                partial(measure_simulate_mock, env_id, size, False, 1, **timing),
                partial(measure_simulate_mock, env_id, size, False, steps_per_call, **timing),
                partial(measure_simulate_mock, env_id, size, True, steps_per_call,
                        processes=True, **timing),
                partial(measure_ppo_inference, env_id, size, steps_per_call, **timing),
                partial(measure_ppo_training, env_id, size, steps_per_call, **training),
            ])
    return results


def run_pairs(envs, seconds, warmup, steps_per_call=100, log=print, inter_op_threads=None,
              own_inter_op_threads=None):
    """Runs `measure_paired` for every pair of `PAIRS` of an environment in `envs`.

    Args:
      envs: Gymnasium ids; pairs of other environments are skipped.
      seconds, warmup, steps_per_call: see `measure_paired`.
      log: callable receiving one line per pair.
      inter_op_threads, own_inter_op_threads: see `run_benchmark`; the threads are those
        training would use for the pair's `kind`.

    Returns:
      list of `PairedMeasurement`s.
    """
    from batchrl.scripts import train

    results = []
    for env_id, num_envs, kind, baseline in PAIRS:
        if env_id not in envs:
            continue
        args = (env_id, num_envs, kind, baseline, steps_per_call, seconds, warmup)
        threads = inter_op_threads
        if threads is None:
            processes = kind == "simulate_mock_processes"
            threads = train.inter_op_threads(env_config(env_id, num_envs, processes))
        if own_inter_op_threads is None or threads == own_inter_op_threads:
            pair = measure_paired(*args)
        else:
            pair = _isolated(measure_paired, threads, *args)
        results.append(pair)
        log(f"{pair.env:>21} {pair.num_envs:>4} {pair.kind} / {pair.baseline}: "
            f"{pair.ratio:.3f} (median of {len(pair.ratios)} pairs of windows; "
            f"{pair.steps_per_second:,.0f} / {pair.baseline_steps_per_second:,.0f} steps/s)")
    return results


def _isolated(measure, inter_op_threads, *args, **kwargs):
    """Runs `measure(*args, **kwargs)` (a `measure_` function of this module) in a new
    Python process whose TensorFlow has `inter_op_threads` inter-op threads (fixed once
    TensorFlow runs, so this process cannot change them); returns its `Measurement` (a
    `PairedMeasurement` for `measure_paired`).

    Raises:
      RuntimeError: the process failed (its error output is in the message).
    """
    request = json.dumps({"measure": measure.__name__, "args": args, "kwargs": kwargs,
                          "inter_op_threads": inter_op_threads})
    result = subprocess.run([sys.executable, __file__, "--measure", request],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{measure.__name__}{tuple(args)} failed in its own process "
                           f"(exit code {result.returncode}):\n{result.stderr[-3000:]}")
    fields = json.loads(result.stdout.splitlines()[-1])
    if measure is measure_paired:
        return PairedMeasurement(**{**fields, "ratios": tuple(fields["ratios"])})
    return Measurement(**fields)


def _measure_request(request):
    """The other end of `_isolated`: runs the request, prints the `Measurement` as JSON."""
    from batchrl.scripts.train import set_inter_op_threads

    request = json.loads(request)
    set_inter_op_threads(request["inter_op_threads"])
    measure = globals()[request["measure"]]
    if not (request["measure"].startswith("measure_") and callable(measure)):
        raise ValueError(f"not a measurement: {request['measure']!r}")
    measurement = measure(*request["args"], **request["kwargs"])
    print(json.dumps(dataclasses.asdict(measurement)), flush=True)
    return 0


# A fixed amount of pure-Python work, timed by the process that runs it (`effective_cores`).
_BUSY_LOOP = ("import time\nstart = time.perf_counter()\ntotal = 0\nfor i in range({}):\n"
              "    total += i\nprint(time.perf_counter() - start)")


def effective_cores(loops=5_000_000):
    """How many cores the machine gives right now (float).

    `os.cpu_count()` Python processes run the same busy loop at once; each one's speed
    relative to one process running it alone is summed. On an idle machine with as many
    real cores it is about `os.cpu_count()`; less when other virtual machines share the
    host or the cores are hyperthreads of fewer physical ones. Then the core limit (the
    single environment times `os.cpu_count()`) cannot be reached by anyone.

    Args:
      loops: iterations of the busy loop (5,000,000: about 0.2-0.4 s).
    """
    code = _BUSY_LOOP.format(int(loops))

    def run(count):
        processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                      text=True) for _ in range(count)]
        return [float(process.communicate()[0]) for process in processes]

    alone = min(run(1) + run(1))
    return sum(alone / seconds for seconds in run(os.cpu_count() or 1))


def machine_info():
    """The machine and software versions (dict of str and int)."""
    import mujoco
    import tensorflow as tf

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "gymnasium": gym.__version__,
        "mujoco": mujoco.__version__,
        "numpy": np.__version__,
    }


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
    machine = machine or machine_info()
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
    section that scripts/time_breakdown.py wrote there, if any."""
    import time_breakdown

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = time_breakdown.read_section(path)
    path.write_text(markdown(report))
    if kept:
        time_breakdown.write_section(path, kept)


def _parser():
    parser = argparse.ArgumentParser(
        description="Environment steps per second of BatchEnv, ExternalProcess, simulate "
                    "and BatchPPO against a single environment, the core limit and "
                    "Gymnasium's vector environments. Writes JSON and Markdown.")
    parser.add_argument("--envs", nargs="+", metavar="ID",
                        help="Gymnasium ids and in-graph environments (default: "
                             f"{' '.join(DEFAULTS['envs'])})")
    parser.add_argument("--sizes", nargs="+", type=int, metavar="N",
                        help="batch sizes of Gymnasium environments (default: "
                             f"{' '.join(map(str, DEFAULTS['sizes']))})")
    parser.add_argument("--native-sizes", nargs="+", type=int, metavar="N",
                        help="batch sizes of in-graph environments (default: "
                             f"{' '.join(map(str, DEFAULTS['native_sizes']))})")
    parser.add_argument("--steps-per-call", type=int, metavar="K",
                        help="batch steps per tf.function call of the K-step kinds "
                             f"(default: {DEFAULTS['steps_per_call']})")
    parser.add_argument("--seconds", type=float,
                        help=f"timed seconds per measurement (default: {DEFAULTS['seconds']:g})")
    parser.add_argument("--warmup", type=float,
                        help=f"warm-up seconds per measurement (default: {DEFAULTS['warmup']:g})")
    parser.add_argument("--min-updates", type=int,
                        help="PPO updates the training window includes at least "
                             f"(default: {DEFAULTS['min_updates']})")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help="rounds of every measurement; figures are the medians "
                             f"(default: {DEFAULTS['repeats']})")
    parser.add_argument("--inter-op-threads", type=int, metavar="N",
                        help="TensorFlow's inter-op threads of every measurement (0: "
                             "TensorFlow's default; default: those training uses, the "
                             "config key inter_op_threads: null; measurements that need "
                             "other threads than this process run in their own process)")
    parser.add_argument("--learning-seeds", nargs="*", type=int, metavar="SEED",
                        help=f"seeds of the BatchPPO runs on {LEARNING_CONFIG} timed to eval "
                             f">= {LEARNING_THRESHOLD:g}; none to skip them (default: "
                             f"{' '.join(map(str, DEFAULTS['learning_seeds']))}; --quick: "
                             "none)")
    parser.add_argument("--learning-steps", type=int, metavar="N",
                        help="training steps of each of those runs (default: "
                             f"{DEFAULTS['learning_steps']:,})")
    parser.add_argument("--pair-seconds", type=float, metavar="S",
                        help="timed seconds of each paired measurement of the goals (0 to "
                             f"skip them; default: {DEFAULTS['pair_seconds']:g}; --quick: 0)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # See `_isolated`.
    parser.add_argument("--max-train-seconds", type=float, default=600.0,
                        help="cap of a training window, in seconds (default: %(default)g)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: sizes {sizes}, {seconds:g} s, {warmup:g} s warm-up, "
                             "no update required (explicit options win)".format(**{
                                 **QUICK, "sizes": " ".join(map(str, QUICK["sizes"]))}))
    parser.add_argument("--json", default="docs/performance.json",
                        help="JSON output (default: %(default)s)")
    parser.add_argument("--output", default="docs/performance.md",
                        help="Markdown output (default: %(default)s)")
    return parser


def _command(argv):
    executable = pathlib.Path(sys.executable)
    with contextlib.suppress(ValueError):
        executable = executable.relative_to(pathlib.Path.cwd())
    script = pathlib.Path(__file__).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(pathlib.Path.cwd())
    return shlex.join([str(executable), str(script), *argv])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.measure:
        return _measure_request(args.measure)
    preset = QUICK if args.quick else DEFAULTS
    settings = {key: getattr(args, key) if getattr(args, key) is not None else value
                for key, value in preset.items()}
    settings.update(quick=args.quick, max_train_seconds=args.max_train_seconds)
    if (any(size <= 0 for size in settings["sizes"] + settings["native_sizes"])
            or settings["seconds"] <= 0 or settings["steps_per_call"] <= 0
            or settings["repeats"] <= 0 or (settings["inter_op_threads"] or 0) < 0
            or settings["learning_steps"] <= 0 or settings["pair_seconds"] < 0):
        print("error: sizes, seconds, steps per call, repeats and learning steps must be "
              "positive, inter-op threads and pair seconds not negative", file=sys.stderr)
        return 2
    try:
        for env_id in settings["envs"]:
            environments.check_env_id(env_id)
    except configs.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = _command(argv)
    print(f"{command}: {os.cpu_count()} CPUs; envs {' '.join(settings['envs'])}; sizes "
          f"{' '.join(map(str, settings['sizes']))} (in-graph: "
          f"{' '.join(map(str, settings['native_sizes']))}); K = "
          f"{settings['steps_per_call']}; {settings['seconds']:g} s each, "
          f"{settings['repeats']} repeats; learning runs: seeds "
          f"{' '.join(map(str, settings['learning_seeds'])) or 'none'}.", flush=True)
    from batchrl.scripts.train import set_inter_op_threads

    # This process takes the threads of in-process Gymnasium environments, the most
    # frequent measurements.
    own_threads = 1 if settings["inter_op_threads"] is None else settings["inter_op_threads"]
    set_inter_op_threads(own_threads)
    cores_before = effective_cores()
    print(f"Effective cores: {cores_before:.2f} of {os.cpu_count()}.", flush=True)
    measurements = run_benchmark(
        settings["envs"], settings["sizes"], settings["seconds"], settings["warmup"],
        settings["min_updates"], settings["max_train_seconds"],
        log=functools.partial(print, flush=True), native_sizes=settings["native_sizes"],
        steps_per_call=settings["steps_per_call"], repeats=settings["repeats"],
        inter_op_threads=settings["inter_op_threads"], own_inter_op_threads=own_threads)
    pairs = []
    if settings["pair_seconds"] > 0:
        pairs = run_pairs(
            settings["envs"], settings["pair_seconds"], settings["warmup"],
            settings["steps_per_call"], log=functools.partial(print, flush=True),
            inter_op_threads=settings["inter_op_threads"], own_inter_op_threads=own_threads)
    learning = []
    with tempfile.TemporaryDirectory(prefix="batchrl-bench-learning-") as logdir:
        for seed in settings["learning_seeds"]:
            run = measure_learning(seed, settings["learning_steps"], logdir)
            learning.append(run)
            reached = run["seconds_to_threshold"]
            print(f"{LEARNING_CONFIG} seed {seed}: eval >= {LEARNING_THRESHOLD:g} "
                  + ("not reached" if reached is None else
                     f"after {reached:.0f} s ({run['steps_to_threshold']:,} steps)")
                  + f"; final {run['final_return']:.1f}; {run['command_seconds']:.0f} s in all",
                  flush=True)
    leftover = multiprocessing.active_children()
    if leftover:
        print(f"warning: {len(leftover)} child processes still alive", file=sys.stderr)
    machine = {**machine_info(), "effective_cores": [cores_before, effective_cores()]}
    report = build_report(measurements, settings, command, machine=machine,
                          learning=learning, pairs=pairs)
    write_json(report, args.json)
    write_markdown(report, args.output)
    print(f"Wrote {args.json} and {args.output}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

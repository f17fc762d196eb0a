"""The throughput benchmark's measurements of raw stepping, which need no TensorFlow: one
environment in a plain loop (alone and one per core), `BatchEnv` (in-process and with
`ExternalProcess` workers), `ParallelBatchEnv` and Gymnasium's vector environments; the
`Measurement` records and timing helpers, and the machine (`effective_cores`,
`machine_info`, which imports TensorFlow for its version). Worker processes of the
benchmark import this module: it stays light."""

import contextlib
import dataclasses
import functools
import itertools
import multiprocessing
import os
import pathlib
import platform
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np

from batchrl import configs, environments
from batchrl.environments import wrappers
from batchrl.environments.local import BatchEnv
from benchmarks import child_environment

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Before anything imports TensorFlow.

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


def warm_up(call, warmup):
    """Calls `call()` at least twice and for at least `warmup` wall-clock seconds."""
    call()
    call()
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        call()


def timed_window(call, seconds):
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


def run_timed(call, seconds, warmup):
    """Calls `call()` for `warmup` seconds (at least twice), then for `seconds` seconds.

    Args:
      call: zero-argument callable returning the environment steps it took (int).
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `(steps, elapsed, calls)` of the timed part: environment steps, wall-clock seconds
      (at least `seconds`; the last call is finished), calls.
    """
    warm_up(call, warmup)
    return timed_window(call, seconds)


def action_pool(space, shape, seed=0):
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
    backend = {} if environments.envpool_task(env_id) else {
        "env_backend": "processes" if processes else "local"}
    config = configs.load("default", {"env": env_id, "num_agents": num_envs, **backend})
    environments.check_env_id(env_id)
    return config


@contextlib.contextmanager
def open_batch_env(config):
    """The config's batch (as training builds it), closed on exit; yields
    `(batch_env, setup_seconds)`."""
    start = time.perf_counter()
    batch_env = environments.create_batch(config)
    try:
        yield batch_env, time.perf_counter() - start
    finally:
        batch_env.close()


# Measurements: one function per kind.


@contextlib.contextmanager
def single_env_stepper(env_id):
    """One environment (built with `environments.create`; for an in-graph environment its
    Gymnasium equivalent), stepped with random actions and reset when its episode ends;
    closed on exit. Yields `(call, setup_seconds)`: `call()` takes `SINGLE_ENV_CHUNK` steps
    and returns that number."""
    start = time.perf_counter()
    env = environments.create(environments.gymnasium_id(env_id))
    setup = time.perf_counter() - start
    try:
        actions = itertools.cycle(action_pool(env.action_space, None))
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
from benchmarks.throughput import baselines
with baselines.single_env_stepper({env_id!r}) as (call, _):
    print("ready", flush=True)
    for line in sys.stdin:
        steps, _, _ = baselines.timed_window(call, float(line))
        print(steps, flush=True)
"""

# Seconds of one call of `single_env_per_core`'s stepper (all processes step this long).
PER_CORE_SLICE = 0.05


@contextlib.contextmanager
def single_env_per_core_stepper(env_id):
    """`os.cpu_count()` processes, each stepping one environment in a plain loop as
    `single_env` does, all at the same time; ended on exit. Yields `(call, setup_seconds)`:
    `call()` lets every process step for `PER_CORE_SLICE` seconds and returns the steps
    they took together. The processes get the Gymnasium id (`environments.gymnasium_id`):
    an in-graph environment's module, which imports TensorFlow, stays out of them."""
    start = time.perf_counter()
    code = _LOOP_WORKER.format(env_id=environments.gymnasium_id(env_id))
    processes = []
    try:
        for _ in range(os.cpu_count() or 1):
            processes.append(subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, bufsize=1, env=child_environment(TF_CPP_MIN_LOG_LEVEL="2")))
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
    with single_env_per_core_stepper(env_id) as (call, setup):
        steps, elapsed, calls = run_timed(call, seconds, warmup)
    return Measurement("single_env_per_core", env_id, os.cpu_count() or 1, steps, elapsed,
                       calls, setup)


def measure_single_env(env_id, seconds, warmup):
    """Steps one environment in a plain Python loop, random actions, reset when its episode
    ends (terminated or truncated by the time limit).

    Args:
      env_id: a Gymnasium id; for an in-graph environment (`batchrl.native_tasks:Pendulum`) its
        Gymnasium equivalent is stepped (the reference that the in-graph one replaces).
      seconds: the timed budget, in wall-clock seconds.
      warmup: the untimed warm-up, in wall-clock seconds.

    Returns:
      `Measurement` of kind `single_env`: environment steps per second of one core.
    """
    with single_env_stepper(env_id) as (call, setup):
        steps, elapsed, calls = run_timed(call, seconds, warmup)
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
def batch_env_stepper(env_id, num_envs, kind):
    """A batch of `kind` (see `measure_batch_env`) stepped from Python with random valid
    actions, the environments whose episode ended reset with `reset(indices)`; closed on
    exit. Yields `(call, setup_seconds)`: `call()` takes one batch step and returns
    `num_envs`."""
    if kind == "batch_env_processes":
        batch = _external_batch_env(env_config(env_id, num_envs, True))
    elif kind in ("batch_env", "parallel_batch_env"):
        batch = open_batch_env(env_config(env_id, num_envs, kind == "parallel_batch_env"))
    else:
        raise ValueError(f"not a batch kind: {kind!r}")
    with batch as (batch_env, setup):
        actions = itertools.cycle(action_pool(batch_env.action_space, num_envs))

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
    with batch_env_stepper(env_id, num_envs, kind) as (call, setup):
        steps, elapsed, calls = run_timed(call, seconds, warmup)
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
        actions = itertools.cycle(action_pool(envs.action_space, None))
        autoreset = np.zeros(num_envs, bool)

        def call():
            nonlocal autoreset
            _, _, terminated, truncated, _ = envs.step(next(actions))
            stepped = num_envs - int(autoreset.sum())
            autoreset = np.logical_or(terminated, truncated)
            return stepped

        steps, elapsed, calls = run_timed(call, seconds, warmup)
    except BaseException:
        envs.close(terminate=True)  # Workers may be mid-step: do not wait for them.
        raise
    envs.close()
    return Measurement(kind, env_id, num_envs, steps, elapsed, calls, setup)


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

"""The throughput benchmark's measurements through `simulate` (TensorFlow, imported by the
functions that need it): `simulate` with `MockAlgorithm`, BatchPPO's inference and
training, the learning runs of the training command, and paired measurements of two kinds
in alternating windows."""

import contextlib
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time

from batchrl import configs, environments
from benchmarks.throughput import baselines
from benchmarks.throughput.settings import CONFIG_NAMES, LEARNING_CONFIG, LEARNING_THRESHOLD


def config_name(env_id):
    """The config BatchPPO is built from for `env_id`: `CONFIG_NAMES`, else the first
    shipped config (sorted by name) whose `env` is `env_id`, else `default`."""
    if env_id in CONFIG_NAMES:
        return CONFIG_NAMES[env_id]
    for name in configs.available():
        if configs.load(name).env == env_id:
            return name
    return "default"


def loop_step_function(batch_env, algo, steps_per_call, writer=None, step=None,
                       jit_compile=False):
    """The training loop's step function (`batchrl.drivers.loop.step_function`, imported
    here: it imports TensorFlow) of `algo` over the in-graph `batch_env`, `steps_per_call`
    batch steps a call; `writer`, `step` and `jit_compile` as there."""
    from batchrl.drivers.loop import step_function

    return step_function(batch_env, algo, steps_per_call, writer, step,
                         jit_compile=jit_compile)


def simulate_call(function, batch, steps_per_call):
    """A `run_timed` call: one full call of `function` (a `loop_step_function`) without
    logging or forced reset, waited for; returns the environment steps it took (int:
    `batch` environments times `steps_per_call`). As the training loop does, it calls the
    function's traced graph (`batchrl.tools.graph.TracedCall`)."""
    import tensorflow as tf

    from batchrl.tools.graph import TracedCall

    false, count = tf.constant(False), tf.constant(steps_per_call)
    traced = TracedCall(function)

    def call():
        done, _ = traced(false, false, count)
        done.numpy()
        return batch * steps_per_call

    return call


def measure_simulate_mock(env_id, num_envs, processes, steps_per_call, seconds, warmup):
    """Steps `simulate` with `MockAlgorithm` (random valid actions) through the training
    loop's step function (`batchrl.drivers.loop.step_function`).

    The batch is built as training builds it (`environments.create_batch`). An in-graph
    environment (`batchrl.native_tasks`) runs with `jit_compile=True`: the whole call is one XLA
    computation.

    Args:
      env_id: a Gymnasium id, or an in-graph environment (`batchrl.native_tasks:Pendulum`).
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
        steps, elapsed, calls = baselines.run_timed(call, seconds, warmup)
    return baselines.Measurement(kind, env_id, num_envs, steps, elapsed, calls, setup)


@contextlib.contextmanager
def _simulate_mock_stepper(env_id, num_envs, processes, steps_per_call):
    """`simulate` with `MockAlgorithm` as `measure_simulate_mock` runs it; the batch is
    closed on exit. Yields `(call, setup_seconds)`: `call()` runs one full call of the
    step function and returns its environment steps."""
    from batchrl.environments.in_graph import InGraphBatchEnv
    from batchrl.tools.mock_algorithm import MockAlgorithm

    native = environments.native_class(env_id) is not None
    config = baselines.env_config(env_id, num_envs, processes)
    with baselines.open_batch_env(config) as (batch_env, setup):
        start = time.perf_counter()
        in_graph = batch_env if native else InGraphBatchEnv(batch_env)
        function = loop_step_function(in_graph, MockAlgorithm(in_graph, seed=0), steps_per_call,
                                  jit_compile=native)
        setup += time.perf_counter() - start
        yield simulate_call(function, num_envs, steps_per_call), setup


def _in_process(env_id):
    """The `env_backend` override that steps `env_id` in this process: local, or none for
    an EnvPool task (`envpool:TASK` chooses env_backend envpool)."""
    return {} if environments.envpool_task(env_id) else {"env_backend": "local"}


def _agent_config(env_id, num_envs, overrides):
    """BatchPPO's config for `env_id` (in-process environments) and the module that builds
    the agent (imported here: it imports TensorFlow)."""
    from batchrl import build as build_lib

    config = configs.load(config_name(env_id), {
        "env": env_id, "num_agents": num_envs, **_in_process(env_id), **(overrides or {})})
    build_lib.check(config)
    return config, build_lib


def measure_ppo_inference(env_id, num_envs, steps_per_call, seconds, warmup, overrides=None):
    """Steps `simulate` with BatchPPO acting (mean action), learning off.

    The agent is built with `batchrl.build.build` from the environment's config
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
    config, build_lib = _agent_config(env_id, num_envs, overrides)
    with baselines.open_batch_env(config) as (batch_env, setup):
        start = time.perf_counter()
        agent = build_lib.build(config, batch_env)
        agent.is_training.assign(False)
        agent.should_log.assign(False)
        function = loop_step_function(agent.batch_env, agent.algo, steps_per_call)
        setup += time.perf_counter() - start
        steps, elapsed, calls = baselines.run_timed(
            simulate_call(function, num_envs, steps_per_call), seconds, warmup)
    return baselines.Measurement("ppo_inference", env_id, num_envs, steps, elapsed, calls, setup)


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

    from batchrl.tools.graph import TracedCall

    config, build_lib = _agent_config(env_id, num_envs, overrides)
    with (baselines.open_batch_env(config) as (batch_env, setup),
          tempfile.TemporaryDirectory(prefix="batchrl-bench-") as logdir):
        start = time.perf_counter()
        agent = build_lib.build(config, batch_env)
        writer = tf.summary.create_file_writer(logdir)
        function = loop_step_function(agent.batch_env, agent.algo, steps_per_call, writer,
                                  agent.step)
        iterations = agent.algo.checkpoint_state["policy_optimizer"].iterations
        setup += time.perf_counter() - start
        # Warm-up with learning off: traces, and leaves the memory empty.
        agent.is_training.assign(False)
        agent.should_log.assign(False)
        baselines.warm_up(simulate_call(function, num_envs, steps_per_call), warmup)
        agent.is_training.assign(True)
        agent.should_log.assign(True)
        true, false = tf.constant(True), tf.constant(False)
        count = tf.constant(steps_per_call)
        traced = TracedCall(function)  # Called as the training loop calls it.
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
                done, _ = traced(true if log else false, reset, count)
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
    return baselines.Measurement("ppo_training", env_id, num_envs, steps, now - start, calls,
                                 setup, updates)


def measure_learning(seed, steps, logdir, config=LEARNING_CONFIG,
                     threshold=LEARNING_THRESHOLD, overrides=()):
    """Trains `config` with `seed` for `steps` steps with the training command (`python -m
    batchrl.scripts.train`, a new process, as a user runs it) in `logdir/seed-SEED`, and
    reads when its eval return first reached `threshold` (`time_to_threshold`).

    Args:
      seed: int, the config's `seed`.
      steps: int, the config's `steps` (training environment steps of the run).
      logdir: folder for the run directory (which must not hold a run of another config).
      config: a config name or path.
      threshold: the eval return (`mean_score` of the eval phases) to reach.
      overrides: further `KEY=VALUE` strings, each given to the command with `--set`.

    Returns:
      dict with `seed`, `steps` (of the run), `command_seconds` (the whole command), and
      the keys of `time_to_threshold`.

    Raises:
      RuntimeError: the training command failed (its last output is in the message).
    """
    run_dir = pathlib.Path(logdir) / f"seed-{seed}"
    command = [sys.executable, "-m", "batchrl.scripts.train", f"--config={config}",
               f"--logdir={run_dir}", "--no-progress", "--set", f"seed={seed}",
               "--set", f"steps={steps}"]
    for pair in overrides:
        command += ["--set", pair]
    start = time.time()
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    command_seconds = time.time() - start
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed (exit code {result.returncode}):\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")
    return {"seed": seed, "steps": steps, "command_seconds": command_seconds,
            **time_to_threshold(run_dir, start, threshold)}


def time_to_threshold(run_dir, start, threshold=LEARNING_THRESHOLD):
    """When the training run in `run_dir`, whose command started at `start` (seconds since
    the epoch, as `time.time()`), first reached the eval return `threshold`.

    Returns:
      dict with `seconds_to_threshold` (from `start`, TensorFlow's import, tracing and
      evaluations included, to the eval summary that first reached `threshold`),
      `training_seconds_to_threshold` (the same from the start of training, the eval's
      `time/training_seconds`, as in docs/results.md), `steps_to_threshold` (None for
      the three when not reached), `final_return` and `best_return` (floats).
    """
    from batchrl.scripts import plot, run_summary
    from batchrl.scripts.events import read_scalars

    run_dir = pathlib.Path(run_dir)
    summary = run_summary.summarize(plot.read_run(run_dir), threshold)
    scores = read_scalars(run_dir / "eval", "mean_score")
    reached = [scalar.wall_time for scalar in scores if scalar.value >= threshold]
    return {
        "seconds_to_threshold": reached[0] - start if reached else None,
        "training_seconds_to_threshold": summary["seconds_to_threshold"],
        "steps_to_threshold": summary["steps_to_threshold"],
        "final_return": summary["final_return"], "best_return": summary["best_return"],
    }


def _stepper(kind, env_id, num_envs, steps_per_call):
    """The context manager that yields `(call, setup_seconds)` for `kind`."""
    if kind == "single_env":
        return baselines.single_env_stepper(env_id)
    if kind == "single_env_per_core":
        return baselines.single_env_per_core_stepper(env_id)
    if kind in ("batch_env", "batch_env_processes", "parallel_batch_env"):
        return baselines.batch_env_stepper(env_id, num_envs, kind)
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
        baselines.warm_up(call, warmup)
        baselines.warm_up(base_call, warmup)
        ratios, totals = [], {kind: [0, 0.0], baseline: [0, 0.0]}
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or not ratios:
            turns = [(kind, call), (baseline, base_call)]
            rates = {}
            for name, function in turns if len(ratios) % 2 == 0 else turns[::-1]:
                steps, elapsed, _ = baselines.timed_window(function, window)
                rates[name] = steps / elapsed
                totals[name][0] += steps
                totals[name][1] += elapsed
            ratios.append(rates[kind] / rates[baseline])
    return baselines.PairedMeasurement(kind, baseline, env_id, num_envs, tuple(ratios),
                                       totals[kind][0] / totals[kind][1],
                                       totals[baseline][0] / totals[baseline][1],
                                       setup + base_setup)

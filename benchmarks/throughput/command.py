"""Environment steps per second of batchrl's stepping paths, side by side with baselines.

    .venv/bin/python -m benchmarks.throughput            # or: make bench
    .venv/bin/python -m benchmarks.throughput --envs Pendulum-v1 --sizes 8 32 \\
        --seconds 3 --json /tmp/perf.json --output /tmp/perf.md
    .venv/bin/python -m benchmarks.throughput --quick --json /tmp/q.json \\
        --output /tmp/q.md                              # smoke test, ~1-2 minutes
    .venv/bin/python -m benchmarks.throughput --envs HalfCheetah-v5 --kinds single_env \\
        batch_env parallel_batch_env                    # some kinds only

For every environment id (`--envs`) and every batch size (`--sizes`) it measures, in one
run and one process, environment steps per second (every environment's step counts) of:

- `single_env`: one environment (built with `batchrl.environments.create`) stepped
  in a plain Python loop, reset when its episode ends: the per-core reference. Times
  `os.cpu_count()` it is the machine's core limit (the limit if stepping were perfectly
  parallel and free of overhead).
- `single_env_per_core`: the same loop in `os.cpu_count()` processes at once, their steps
  summed: the core limit as the machine gives it now (less than the above when the host's
  cores are shared with other virtual machines).
- `batch_env` / `batch_env_processes` / `parallel_batch_env`: `BatchEnv` in-process with
  blocking calls (as training builds it for `env_backend: local`), `BatchEnv` of one
  `ExternalProcess` worker per environment stepped with non-blocking calls, and
  `ParallelBatchEnv` (as training builds it for `env_backend: processes`: one worker per core,
  each hosting a group of the environments, shared memory). Random valid actions; the
  environments whose episode ended are reset with `reset(indices)`.
- `sync_vector_env` / `async_vector_env`: Gymnasium's `SyncVectorEnv` and
  `AsyncVectorEnv` (forkserver workers, shared memory) of the same environments, random
  actions sampled from the vector action space. Autoreset is Gymnasium 1.x's default
  (`NEXT_STEP`): the call after an episode ended resets that environment instead of
  stepping it; such reset-only entries are not counted as steps.
- `simulate_mock` / `simulate_mock_loop` / `simulate_mock_processes`:
  `batchrl.drivers.simulate` with `MockAlgorithm` (random actions) through the training
  loop's step function (`batchrl.drivers.loop.step_function`): in-process with one step per
  `tf.function` call and with K (`--steps-per-call`) steps per call, and with the worker
  `ParallelBatchEnv` that training starts for `env_backend: processes`, K steps per call.
- `ppo_inference`: the same with BatchPPO (`batchrl.build.build` from the config of
  the environment, e.g. `pendulum` or `cheetah`, with `num_agents` overridden and
  in-process environments), `is_training` false: the mean action, nothing recorded; K
  steps per call.
- `ppo_training`: the same with `is_training` true and the config's update schedule,
  summaries written as in training; the wall time includes the PPO updates. The timed
  window starts with new episodes for all agents and an empty memory and, once the time
  budget is over, runs on until the end of the next update (at least `--min-updates`), so
  that it spans whole collect-and-update cycles.

An in-graph environment (`batchrl.native_tasks:Pendulum`, batch sizes `--native-sizes`) gets
`single_env` of its Gymnasium equivalent and `simulate_mock_loop` (compiled with XLA),
`ppo_inference` and `ppo_training`, all K steps per call. An EnvPool task
(`envpool:HalfCheetah-v5`, batch sizes `--sizes`) gets `single_env` of the Gymnasium
environment of the same id, `batch_env` (EnvPool's own batch stepping, as training builds
it), `simulate_mock_loop`, `ppo_inference` and `ppo_training`.

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
ratios, and the learning runs.

The parts live next to this file, one module each of `benchmarks.throughput`: `settings`
(the kinds, their `BASELINES`, the defaults, `PAIRS` and `GOALS`), `baselines` (the
`Measurement` records, timing helpers and the measurements of raw stepping, without
TensorFlow; the machine), `simulate` (`simulate` with `MockAlgorithm` and BatchPPO, the
learning runs, the paired measurements) and `report` (ratios, goals, JSON and Markdown).
This module holds the command: `run_benchmark`, `run_pairs` and `main`. TensorFlow is
imported only by the measurements that need it, so that worker processes importing
`baselines` stay light. `python -m benchmarks.throughput breakdown` runs the suite's other
part (`breakdown`: where a training run's time goes).
"""

import argparse
import contextlib
import dataclasses
import functools
import json
import multiprocessing
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

from batchrl import configs, environments
from benchmarks import child_environment
from benchmarks.throughput import baselines, simulate
from benchmarks.throughput import report as report_lib
from benchmarks.throughput.settings import (
    DEFAULTS,
    KINDS,
    LEARNING_CONFIG,
    LEARNING_THRESHOLD,
    PAIRS,
    QUICK,
)


def run_benchmark(envs, sizes, seconds, warmup, min_updates=1, max_train_seconds=600.0,
                  log=print, native_sizes=(32, 4096), steps_per_call=100, repeats=1,
                  inter_op_threads=None, own_inter_op_threads=None, kinds=None):
    """Runs every measurement for every environment id and batch size.

    With `repeats` > 1 the measurements of one environment and batch size run in
    `repeats` rounds, one of each kind per round, so that slow drifts of the machine's
    speed hit every kind alike; each kind's result is its median repeat (its `samples`
    hold every repeat's steps/s). The single environment is repeated likewise, first.

    Args:
      envs: Gymnasium ids, in-graph environments (`batchrl.native_tasks:Pendulum`) and EnvPool
        tasks (`envpool:HalfCheetah-v5`).
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
      kinds: keys of `KINDS` to measure, of those that apply to each environment; None
        for all.

    Returns:
      list of `Measurement`s, one per kind, environment and batch size.
    """
    results = []

    def run_group(measures):
        """Runs `repeats` rounds of the zero-argument callables of `measures` (pairs of a
        kind and its callable) whose kind is in `kinds`; records the medians."""
        measures = [measure for kind, measure in measures if kinds is None or kind in kinds]
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
            threads = train.inter_op_threads(baselines.env_config(env_id, size, processes))
        if own_inter_op_threads is None or threads == own_inter_op_threads:
            return functools.partial(measure, env_id, size, *args, **kwargs)
        return functools.partial(_isolated, measure, threads, env_id, size, *args, **kwargs)
    for env_id in envs:
        run_group([("single_env", functools.partial(baselines.measure_single_env, env_id,
                                                     **timing)),
                   ("single_env_per_core", functools.partial(
                       baselines.measure_single_env_per_core, env_id, **timing))])
        if environments.native_class(env_id):
            for size in native_sizes:
                run_group([
                    ("simulate_mock_loop", partial(simulate.measure_simulate_mock, env_id,
                                                   size, False, steps_per_call, **timing)),
                    ("ppo_inference", partial(simulate.measure_ppo_inference, env_id, size,
                                              steps_per_call, **timing)),
                    ("ppo_training", partial(simulate.measure_ppo_training, env_id, size,
                                             steps_per_call, **training)),
                ])
            continue
        if environments.envpool_task(env_id) is not None:
            # EnvPool's own batch stepping, and simulate and BatchPPO around it.
            for size in sizes:
                run_group([
                    ("batch_env", partial(baselines.measure_batch_env, env_id, size,
                                          "batch_env", **timing)),
                    ("simulate_mock_loop", partial(simulate.measure_simulate_mock, env_id,
                                                   size, False, steps_per_call, **timing)),
                    ("ppo_inference", partial(simulate.measure_ppo_inference, env_id, size,
                                              steps_per_call, **timing)),
                    ("ppo_training", partial(simulate.measure_ppo_training, env_id, size,
                                             steps_per_call, **training)),
                ])
            continue
        for size in sizes:
            run_group([
                *((kind, partial(baselines.measure_batch_env, env_id, size, kind, **timing))
                  for kind in ("batch_env", "batch_env_processes", "parallel_batch_env")),
                ("sync_vector_env", partial(baselines.measure_gymnasium_vector, env_id, size,
                                            False, **timing)),
                ("async_vector_env", partial(baselines.measure_gymnasium_vector, env_id, size,
                                             True, **timing)),
                ("simulate_mock", partial(simulate.measure_simulate_mock, env_id, size, False,
                                          1, **timing)),
                ("simulate_mock_loop", partial(simulate.measure_simulate_mock, env_id, size,
                                               False, steps_per_call, **timing)),
                ("simulate_mock_processes", partial(
                    simulate.measure_simulate_mock, env_id, size, True, steps_per_call,
                    processes=True, **timing)),
                ("ppo_inference", partial(simulate.measure_ppo_inference, env_id, size,
                                          steps_per_call, **timing)),
                ("ppo_training", partial(simulate.measure_ppo_training, env_id, size,
                                         steps_per_call, **training)),
            ])
    return results


def run_pairs(envs, seconds, warmup, steps_per_call=100, log=print, inter_op_threads=None,
              own_inter_op_threads=None, kinds=None):
    """Runs `measure_paired` for every pair of `PAIRS` of an environment in `envs`.

    Args:
      envs: environment ids; pairs of other environments are skipped.
      kinds: keys of `KINDS`; pairs of another kind or baseline are skipped. None: all.
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
        if env_id not in envs or kinds is not None and not {kind, baseline} <= set(kinds):
            continue
        args = (env_id, num_envs, kind, baseline, steps_per_call, seconds, warmup)
        threads = inter_op_threads
        if threads is None:
            processes = kind == "simulate_mock_processes"
            threads = train.inter_op_threads(baselines.env_config(env_id, num_envs, processes))
        if own_inter_op_threads is None or threads == own_inter_op_threads:
            pair = simulate.measure_paired(*args)
        else:
            pair = _isolated(simulate.measure_paired, threads, *args)
        results.append(pair)
        log(f"{pair.env:>21} {pair.num_envs:>4} {pair.kind} / {pair.baseline}: "
            f"{pair.ratio:.3f} (median of {len(pair.ratios)} pairs of windows; "
            f"{pair.steps_per_second:,.0f} / {pair.baseline_steps_per_second:,.0f} steps/s)")
    return results


def _isolated(measure, inter_op_threads, *args, **kwargs):
    """Runs `measure(*args, **kwargs)` (a `measure_` function of `baselines` or
    `simulate`) in a new Python process whose TensorFlow has `inter_op_threads`
    inter-op threads (fixed once TensorFlow runs, so this process cannot change them);
    returns its `Measurement` (a `PairedMeasurement` for `measure_paired`).

    Raises:
      RuntimeError: the process failed (its error output is in the message).
    """
    request = json.dumps({"measure": measure.__name__, "args": args, "kwargs": kwargs,
                          "inter_op_threads": inter_op_threads})
    result = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--measure", request],
                            capture_output=True, text=True, check=False, env=child_environment())
    if result.returncode != 0:
        raise RuntimeError(f"{measure.__name__}{tuple(args)} failed in its own process "
                           f"(exit code {result.returncode}):\n{result.stderr[-3000:]}")
    fields = json.loads(result.stdout.splitlines()[-1])
    if measure is simulate.measure_paired:
        return baselines.PairedMeasurement(**{**fields, "ratios": tuple(fields["ratios"])})
    return baselines.Measurement(**fields)


def _measure_request(request):
    """The other end of `_isolated`: runs the request, prints the `Measurement` as JSON."""
    from batchrl.scripts.train import set_inter_op_threads

    request = json.loads(request)
    set_inter_op_threads(request["inter_op_threads"])
    measure = {**vars(baselines), **vars(simulate)}[request["measure"]]
    if not (request["measure"].startswith("measure_") and callable(measure)):
        raise ValueError(f"not a measurement: {request['measure']!r}")
    measurement = measure(*request["args"], **request["kwargs"])
    print(json.dumps(dataclasses.asdict(measurement)), flush=True)
    return 0


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description="Environment steps per second of BatchEnv, ExternalProcess, simulate "
                    "and BatchPPO against a single environment, the core limit and "
                    "Gymnasium's vector environments. Writes JSON and Markdown.",
        epilog="`python -m benchmarks.throughput breakdown --help`: the suite's other part, "
               "where the wall-clock time of a training run goes.")
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
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), metavar="KIND",
                        help="measure only these kinds (of those that apply to each "
                             "environment) and the pairs of them (default: all: "
                             f"{' '.join(KINDS)})")
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
    """The command line of this run as a user types it (str)."""
    executable = pathlib.Path(sys.executable)
    with contextlib.suppress(ValueError):
        executable = executable.relative_to(pathlib.Path.cwd())
    return shlex.join([str(executable), "-m", "benchmarks.throughput", *argv])


def main(argv=None):
    """Runs the benchmark with the options of `argv` (default: `sys.argv[1:]`); returns the
    exit code (0; 2 for bad options)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.measure:
        return _measure_request(args.measure)
    preset = QUICK if args.quick else DEFAULTS
    settings = {key: getattr(args, key) if getattr(args, key) is not None else value
                for key, value in preset.items()}
    settings.update(quick=args.quick, max_train_seconds=args.max_train_seconds,
                    kinds=args.kinds or list(KINDS))
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
    # Quick mode (a check that everything runs) times a fifth of the busy loop.
    core_loops = 1_000_000 if args.quick else 5_000_000
    cores_before = baselines.effective_cores(core_loops)
    print(f"Effective cores: {cores_before:.2f} of {os.cpu_count()}.", flush=True)
    measurements = run_benchmark(
        settings["envs"], settings["sizes"], settings["seconds"], settings["warmup"],
        settings["min_updates"], settings["max_train_seconds"],
        log=functools.partial(print, flush=True), native_sizes=settings["native_sizes"],
        steps_per_call=settings["steps_per_call"], repeats=settings["repeats"],
        inter_op_threads=settings["inter_op_threads"], own_inter_op_threads=own_threads,
        kinds=settings["kinds"])
    pairs = []
    if settings["pair_seconds"] > 0:
        pairs = run_pairs(
            settings["envs"], settings["pair_seconds"], settings["warmup"],
            settings["steps_per_call"], log=functools.partial(print, flush=True),
            inter_op_threads=settings["inter_op_threads"], own_inter_op_threads=own_threads,
            kinds=settings["kinds"])
    learning = []
    with tempfile.TemporaryDirectory(prefix="batchrl-bench-learning-") as logdir:
        for seed in settings["learning_seeds"]:
            run = simulate.measure_learning(seed, settings["learning_steps"], logdir)
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
    machine = {**baselines.machine_info(),
               "effective_cores": [cores_before, baselines.effective_cores(core_loops)]}
    report = report_lib.build_report(measurements, settings, command, machine=machine,
                                     learning=learning, pairs=pairs)
    report_lib.write_json(report, args.json)
    report_lib.write_markdown(report, args.output)
    print(f"Wrote {args.json} and {args.output}.")
    return 0

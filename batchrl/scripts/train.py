"""Train an agent: `python -m batchrl.scripts.train --config=pendulum --logdir=runs/pendulum`.

The run directory receives the resolved `config.yaml`, checkpoints, TensorBoard event
files in `train/` and `eval/`, and with `save_replay: true` the replay memory of the latest
checkpoint in `replay/` (once, not in every checkpoint). Running the same command again
resumes from the latest checkpoint. Ctrl-C (SIGINT) or SIGTERM stops training after the
current step, saves a checkpoint and exits with 128 + the signal number (a second Ctrl-C
stops at once). With `env_backend: ray`, a local Ray that the run started is stopped when
it exits, however it exits; a cluster it joined (`ray_address`) is left running.
"""

import argparse
import contextlib
import os
import pathlib
import signal
import sys
import threading
import time
import warnings

from batchrl import configs
from batchrl.scripts import compile_cache, quiet, train_actors

# TensorFlow is imported inside functions, so that `--help` and errors in config keys are
# instant and worker processes that import this package's environment code stay light.
# `main` sets TF_CPP_MIN_LOG_LEVEL and imports it quietly (`start_tensorflow`).


def process_start_time():
    """The epoch seconds at which this process started (float), from /proc (Linux; the
    clock's ticks, 10 ms); the current time where /proc cannot say."""
    try:
        ticks = int(pathlib.Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def start_tensorflow(verbose=False, xla_cache=False):
    """Imports TensorFlow and initializes its devices, its start-up logs hidden unless
    `verbose` (`batchrl.scripts.quiet`): call before anything else imports TensorFlow.
    With `xla_cache`, XLA's compiled programs are kept on disk for later runs
    (`batchrl.scripts.compile_cache.enable`).

    The inter-op thread pool can still be sized afterwards (`set_inter_op_threads`): listing
    the devices does not start TensorFlow's runtime.
    """
    quiet.set_log_level(verbose)
    if xla_cache:
        compile_cache.enable()
    with quiet.hidden_stderr(not verbose), _unimportable(_NOT_FOR_TRAINING):
        import tensorflow as tf

        tf.config.list_physical_devices()  # CUDA's cuInit error line comes here.


# Keras imports matplotlib.pyplot, when installed, as it is imported (for its image gallery
# plots), and pandas (for `fit` on data frames; MinAtar installs it), and TensorFlow imports
# Keras: about a sixth and a tenth of `import tensorflow` (docs/throughput.md). The
# commands neither plot through Keras nor fit it on data frames, so both are hidden while
# TensorFlow is imported.
_NOT_FOR_TRAINING = ("matplotlib", "matplotlib.pyplot", "pandas")


@contextlib.contextmanager
def _unimportable(names):
    """Makes the modules `names` that are not imported yet raise ImportError inside the
    block (`sys.modules[name] = None`); importable again after it."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


def check_resume(logdir, config):
    """Checks `config` against the run already in `logdir`, if there is one.

    A resumed run may change `steps` (to train longer) and `eager` (to debug it) and nothing
    else. A directory with a `config.yaml` but no checkpoint (nothing was trained) takes any
    config.

    Raises:
      ConfigError: when `logdir` is a file, or the directory holds a trained run with
        different settings.
    """
    logdir = pathlib.Path(logdir)
    if logdir.exists() and not logdir.is_dir():
        raise configs.ConfigError(f"--logdir {logdir} is a file, not a run directory")
    path = logdir / "config.yaml"
    if path.exists() and (logdir / "checkpoint").exists():
        previous = configs.read_run_config(path)
        changed = sorted(key for key in set(previous) | set(config)
                         if key not in ("steps", "eager")
                         and previous.get(key) != config.get(key))
        if changed:
            details = "; ".join(
                f"{key}: {previous.get(key)!r} -> {config.get(key)!r}" for key in changed)
            raise configs.ConfigError(
                f"{logdir} holds a run with other settings ({details}); resume it with the "
                f"same config or use a new --logdir")


def check(config, logdir, checked_before_tensorflow=False):
    """Everything `train` checks before it starts: the config's keys and algorithm
    (`batchrl.build.check`, which imports TensorFlow) and the checks of
    `check_before_tensorflow` (unless `checked_before_tensorflow`: they passed already).
    The network is checked against the spaces when it is built.

    Raises:
      ConfigError: the first mistake found; nothing was written.
    """
    from batchrl import build as build_lib

    build_lib.check(config)
    if not checked_before_tensorflow:
        check_before_tensorflow(config, logdir)


def check_before_tensorflow(config, logdir):
    """The checks of `check` that need no TensorFlow (and do not import it, but where
    `batchrl.distributed.checks` says): the environment id (but a `module:attribute`, which
    `check` imports), the backend (`environments.check_backend`), the actor-learner keys and
    the run already in `logdir` (`check_resume`); what `main` checks before it imports
    TensorFlow and starts the actors, where `can_check_before_tensorflow` says so.

    Raises:
      ConfigError: the first mistake found; nothing was written.
    """
    from batchrl import environments
    from batchrl.distributed import checks

    if ":" not in config.env:
        environments.check_env_id(config.env)
    environments.check_backend(config)
    checks.check(config)
    check_resume(logdir, config)


def write_run_config(logdir, config):
    """Writes `config` (what the user asked plus the defaults) as the run directory's
    `config.yaml`, creating the directory; call it after `check_resume`."""
    logdir = pathlib.Path(logdir)
    path = logdir / "config.yaml"
    logdir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".yaml.tmp")
    temporary.write_text(configs.dump(config))
    os.replace(temporary, path)


def inter_op_threads(config):
    """The size of TensorFlow's inter-op thread pool for `config` (int; 0: TensorFlow's
    default, one per core): `config.inter_op_threads`, or when that is None, 0 for the
    learner of an actor-learner run (`actors` above 0), 1 for Gymnasium environments
    stepped in this process and for EnvPool, and 0 otherwise.

    With the environments in this process, one thread runs a step's ops one after another,
    none handed between threads, which made batch steps faster and BatchPPO's updates no
    slower; with worker processes (`env_backend: processes`) and with the in-graph
    environments of `batchrl.native_tasks` the default was faster (docs/throughput.md, "Why the
    code is as it is"). A learner steps environments only to evaluate, and with the
    default pool `minatar_breakout_apex`'s learner made 353 updates/s against 255 with one
    thread, `cartpole_impala`'s learned from 33,300 steps/s against 30,900 (2026-11-29).
    """
    from batchrl import environments

    if config.inter_op_threads is not None:
        return config.inter_op_threads
    if config.actors:
        return 0
    if environments.envpool_task(config.env) is not None:
        return 1  # EnvPool's threads step the batch in this process.
    in_process = (config.env_backend == "local"
                  and environments.native_class(config.env) is None)
    return 1 if in_process else 0


def set_inter_op_threads(count):
    """Sizes TensorFlow's inter-op thread pool (`count` threads; 0: TensorFlow's default)
    if TensorFlow has not started yet in this process; else warns and keeps the pool it
    has."""
    import tensorflow as tf

    if tf.config.threading.get_inter_op_parallelism_threads() == count:
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(count)
    except RuntimeError:  # TensorFlow already runs, e.g. several runs in one process.
        warnings.warn(f"inter_op_threads: {count} not applied, TensorFlow already runs in "
                      f"this process", stacklevel=2)


# Grappler passes left out of every training run (`tf.config.optimizer`): the layout
# optimizer (which converts convolutions' data formats for GPUs) and the remapper (which
# fuses op patterns into oneDNN kernels) changed no node of our graphs, whose dense layers
# Keras 3 builds from MatMul and AddV2, but took 0.5 s of the 2.8 s that pendulum's first call
# spent tracing and optimizing; its training calls were no slower (docs/throughput.md, "Why
# the code is as it is"). Measure again for convolutions.
GRAPH_OPTIMIZER_OPTIONS = {"layout_optimizer": False, "remapping": False}


def grappler_off(environ=os.environ):
    """Whether the environment variable `BATCHRL_GRAPPLER` turns Grappler off whole
    (`off`, `0` or `false`, any case): for short runs, such as the commands the tests start
    (ready to train sooner, slower steps after: docs/throughput.md has the figures)."""
    return environ.get("BATCHRL_GRAPPLER", "on").strip().lower() in ("off", "0", "false")


def configure_tensorflow(config):
    """Applies the process-wide TensorFlow settings of a training run of `config`: the
    inter-op thread pool (`inter_op_threads`, `set_inter_op_threads`) and, for the graphs
    optimized from now on, the Grappler passes of `GRAPH_OPTIMIZER_OPTIONS`, or no Grappler
    at all when `grappler_off()`."""
    import tensorflow as tf

    set_inter_op_threads(inter_op_threads(config))
    tf.config.optimizer.set_experimental_options(
        {**GRAPH_OPTIMIZER_OPTIONS, "disable_meta_optimizer": grappler_off()})


def make_loop(config, logdir, agent, progress=None, stop=None, started_at=None, pool=None,
              learners=()):
    """The training `Loop` of `config` for `agent` (`batchrl.build.build`) in
    `logdir`: its schedule, progress output, stop event and start time (`started_at`,
    epoch seconds, for `Loop.startup_seconds`); with `save_replay: true`, the replay
    memory kept once in `logdir/replay/`, beside the latest checkpoint (the Loop's
    `replay`). Given the actors' `pool` (`train_actors.start_actors`), the learner's loop
    (`batchrl.distributed.learner.ActorLearnerLoop`, with the other `learners` that share
    the update, `train_actors.start_learners`; or for an off-policy algorithm
    `batchrl.distributed.apex.ApexLoop`, with the replay memory)."""
    from batchrl.drivers.loop import Loop

    options = dict(steps=config.steps, eval_every=config.eval_every,
                   eval_episodes=config.eval_episodes, log_every=config.log_every,
                   progress=progress, stop=stop, steps_per_call=config.steps_per_call,
                   jit_compile=config.jit_step, started_at=started_at)
    replay = agent.algo.memory if config.save_replay else None
    if pool is not None:
        from batchrl.distributed.actor import sends
        from batchrl.distributed.apex import ApexLoop
        from batchrl.distributed.learner import ActorLearnerLoop

        if sends(config.algorithm) == "transitions":
            return ApexLoop(logdir, *agent, pool=pool, broadcast_every=config.broadcast_every,
                            max_policy_lag=config.max_policy_lag, replay=replay, **options)
        return ActorLearnerLoop(logdir, *agent, pool=pool,
                                broadcast_every=config.broadcast_every,
                                max_policy_lag=config.max_policy_lag, learners=learners,
                                fragment_steps=config.envs_per_actor * config.rollout_length,
                                **options)
    return Loop(logdir, *agent, replay=replay, **options)


def start_actor_process():
    """What an actor runs first (`FragmentActor`'s `setup`): TensorFlow imported quietly
    (`start_tensorflow`), as the command's own process does, unless `TF_CPP_MIN_LOG_LEVEL`
    asks for its INFO lines."""
    start_tensorflow(verbose=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0")


def can_check_before_tensorflow(config):
    """Whether `check_before_tensorflow` may run before this process imports TensorFlow:
    for an algorithm of the registry and one learner. With `learners` above 1 the
    actor-learner checks import TensorFlow (`batchrl.distributed.checks`), and a
    `module:NAME` algorithm's module may; `start_tensorflow` must be the first to."""
    from batchrl.algorithms import registry

    return registry.entry(config.algorithm) is not None and config.learners <= 1


def start_actors_first(config, verbose=False):
    """For `main`, once `check_before_tensorflow` passed before TensorFlow
    (`can_check_before_tensorflow`): starts the actors of `config`
    (`train_actors.start_actors`) before this process imports TensorFlow, if it has actors;
    the actors' processes then import TensorFlow and build while this one does (None
    otherwise). Sets the TensorFlow log level of `verbose` first (`quiet.set_log_level`),
    which the actors take. Otherwise (`learners` above 1, a `module:NAME` algorithm) the
    actors start later, in `_train`.

    Raises:
      ConfigError: as `train_actors.start_actors`.
    """
    if not config.actors:
        return None
    quiet.set_log_level(verbose)
    return train_actors.start_actors(config, start_actor_process)


def train(config, logdir, progress=None, on_phase=None, stop=None, started_at=None,
          filter_logs=False):
    """Trains `config` in `logdir`, resuming from its latest checkpoint.

    With `config.eager`, every `tf.function` runs eagerly during training (so that `print`
    and `pdb` work inside losses); the process's setting is restored afterwards.

    Args:
      config: a validated `Config`.
      logdir: the run directory.
      progress: show a progress bar (None: only on a terminal).
      on_phase: optional callable receiving each `batchrl.drivers.PhaseResult`.
      stop: optional `threading.Event` that stops training after the current step.
      started_at: optional epoch seconds at which the command started; once the step
        function is traced, a line gives the seconds from it to the first training step,
        of which start-up and tracing.
      filter_logs: while training, drop the harmless ERROR lines that TensorFlow logs for
        uint8 ops (`quiet.HARMLESS_LOG_LINES`) and, if the cache is on, when it loads a
        cached XLA program (`compile_cache.HIT_LOG_LINES`), when the C++ logs are at the
        quiet level: the command's own process only, as `sys.stderr` is replaced
        meanwhile (`quiet.filtered_stderr`).

    Returns:
      `(loop, results)`: the `Loop` (for its tracing counts) and the list of phase results.

    Raises:
      ConfigError: a mistake in the config (`check`, or found when the environments are
        created, e.g. an unreachable `ray_address`); nothing was written.
      batchrl.drivers.loop.Interrupted: `stop` was set (or Ctrl-C came in a phase without
        `stop`); a checkpoint of the current step was written first.
      batchrl.drivers.loop.EnvironmentFailed: an environment raised, in its constructor,
        the first reset or during training.
    """
    check(config, logdir)
    return _train(config, logdir, progress, on_phase, stop, started_at, filter_logs)


def _train(config, logdir, progress, on_phase, stop, started_at, filter_logs, pool=None):
    """`train` of a config that `check` passed, with the actors' `pool` if started already
    (`start_actors_first`; it is closed on return)."""
    import tensorflow as tf

    from batchrl import build as build_lib
    from batchrl import environments
    from batchrl.drivers.loop import EnvironmentFailed, Interrupted

    configure_tensorflow(config)
    # Learners that share the update join their cluster before TensorFlow runs anything.
    shared = (train_actors.start_learners(config, logdir, start_actor_process)
              if config.actors and config.learners > 1 else None)
    try:
        batch_env = environments.create_batch(config)
    except configs.ConfigError:  # E.g. an unreachable ray_address.
        raise
    except Exception as error:  # The environments' own code (constructor, first reset).
        raise EnvironmentFailed(
            f"before the first step: cannot create the environments: "
            f"{type(error).__name__}: {error}") from error
    nodes = getattr(batch_env, "worker_nodes", None)
    if nodes:
        print(f"Environments: {len(nodes)} Ray actors on {len(set(nodes))} node(s).",
              flush=True)
    eager = tf.config.functions_run_eagerly()
    learners = ()
    try:
        if config.actors and pool is None:
            # They build while this process builds the learner and traces its functions.
            pool = train_actors.start_actors(config, start_actor_process)
        agent = build_lib.build(config, batch_env)  # Checks the network against the spaces.
        if shared is not None:
            learners, all_reduce = shared
            agent.algo.share_update(all_reduce)
        write_run_config(logdir, config)
        step = agent.step
        loop = make_loop(config, logdir, agent, progress, stop, started_at, pool, learners)
        resumed = loop.restore()
        if resumed:
            print(f"Resuming {logdir} from {resumed} (step {int(step.numpy()):,}).",
                  flush=True)
            if config.save_replay:
                _print_replay(loop, agent.algo.memory)

        def ready():
            if pool is not None:
                loop.trace_learn(config.envs_per_actor)  # While the actors start.
                train_actors.report_actors(config, pool)
            if not config.eager:
                _print_ready(loop)

        try:
            # Loading a cached XLA program, and uint8 ops, log harmless ERROR lines; a
            # quiet run drops them.
            harmless = quiet.HARMLESS_LOG_LINES + (
                compile_cache.HIT_LOG_LINES if compile_cache.enabled() else ())
            with quiet.filtered_stderr(harmless, enabled=filter_logs and quiet.is_quiet()):
                results = loop.run(on_phase=on_phase, on_ready=ready)
        except (Interrupted, KeyboardInterrupt):
            path = loop.save()
            print(f"\nStopped at step {int(step.numpy()):,}; saved {path}. Run the same "
                  f"command again to resume.", file=sys.stderr, flush=True)
            raise Interrupted(path) from None
        return loop, results
    finally:
        if pool is not None:
            pool.close()
        train_actors.close_learners(shared)
        batch_env.close()
        tf.config.run_functions_eagerly(eager)


def _print_replay(loop, memory):
    """Says which replay memory a resumed run continues with (`Loop.replay_restored`)."""
    if loop.replay_restored:
        print(f"Replay memory: {int(memory.size.numpy()):,} transitions from "
              f"{loop.replay_restored}.", flush=True)
    else:
        print("Replay memory: none was saved with this checkpoint (it is not the latest the "
              "run wrote, or the replay/ directory is gone); starting with an empty memory.",
              flush=True)


def _print_ready(loop):
    """Says how long the fixed cost before the first training step took."""
    tracing = f"{loop.tracing_seconds:.1f} s tracing and optimizing the step function"
    if loop.startup_seconds is None:
        print(f"Ready to train after {tracing}.", flush=True)
    else:
        total = loop.startup_seconds + loop.tracing_seconds
        print(f"Ready to train {total:.1f} s after the command: {loop.startup_seconds:.1f} s "
              f"of start-up (imports, environments, networks), {tracing}.", flush=True)


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m batchrl.scripts.train",
        description="Train an agent (on-policy BatchPPO, TRPO, A2C, IMPALA, APPO, PQN; "
                    "off-policy SAC, TD3, DQN; or your own: config key algorithm) on a "
                    "Gymnasium, EnvPool or in-graph environment. With config key actors "
                    "above 0, Ray actors act and this process learns: IMPALA, APPO, "
                    "PPO, TRPO, A2C, PQN and those of build_algorithm from the actors' "
                    "fragments of rollout_length steps, SAC, TD3 and DQN as Ape-X, from "
                    "their n-step transitions with first priorities "
                    "(docs/distributed.md). "
                    "Writes config.yaml, checkpoints and "
                    "TensorBoard summaries (train/, eval/) into LOGDIR; running the same "
                    "command again resumes the run.")
    parser.add_argument(
        "--config", default="pendulum",
        help=f"a config name under configs/ (available: {', '.join(configs.available())}) "
             "or a path to a YAML file; layered over configs/default.yaml "
             "(default: %(default)s)")
    parser.add_argument("--logdir", required=True, help="the run directory")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, the value parsed as YAML (repeatable), "
             "e.g. --set num_agents=16 --set policy_lr=3e-4")
    parser.add_argument(
        "--eager", action="store_true",
        help="run every function eagerly (the same as --set eager=true), so that print "
             "and pdb work inside losses and postprocessing; much slower")
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress bar (default: only when the output is a terminal)")
    quiet.add_verbose_flag(parser)
    return parser


def main(argv=None):
    """The command line (`argv`, default `sys.argv[1:]`). Called with `argv` from other
    code, the start-up it reports is counted from this call, not from the process's start."""
    started_at = process_start_time() if argv is None else time.time()
    args = _parser().parse_args(argv)
    pool = None
    try:
        config = configs.load(args.config, args.set + (["eager=true"] if args.eager else []))
        # A mistake these checks find is reported before TensorFlow's import (~4 s here),
        # and before the actors start.
        early = can_check_before_tensorflow(config)
        if early:
            check_before_tensorflow(config, args.logdir)
            pool = start_actors_first(config, args.verbose)
        start_tensorflow(args.verbose, xla_cache=True)
        check(config, args.logdir, checked_before_tensorflow=early)
    except configs.ConfigError as error:
        if pool is not None:
            pool.close()
        print(f"error: {error}", file=sys.stderr)
        return 2
    actors = train_actors.count(config.actors, "actor")
    agents = (f"{actors} of {config.envs_per_actor} agents, "
              f"{config.num_agents} agents to evaluate" if config.actors else
              f"{config.num_agents} agents")
    print(f"Training {config.env} with {config.algorithm} (config {args.config!r}) into "
          f"{args.logdir} ({agents}, {config.steps:,} steps).", flush=True)
    from batchrl.drivers.loop import EnvironmentFailed, Interrupted

    stop = threading.Event()
    received = []

    def request_stop(signum, frame):
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # A second Ctrl-C: stop now.
        received.append(signum)
        stop.set()

    previous = {signum: signal.signal(signum, request_stop)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        loop, results = _train(config, args.logdir, args.progress, None, stop, started_at,
                               filter_logs=not args.verbose, pool=pool)
    except Interrupted:
        return 128 + (received[0] if received else signal.SIGINT)
    except configs.ConfigError as error:  # E.g. a network that does not fit the spaces.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (EnvironmentFailed, FloatingPointError) as error:
        # A crashed worker, a NaN observation, diverged weights: the latest checkpoint is
        # left as it was.
        print(f"error: training failed {error}", file=sys.stderr)
        return 1
    except Exception as error:
        damaged = compile_cache.damaged_entry_message(error)
        if damaged is None:
            raise
        print(f"error: {damaged}", file=sys.stderr)
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pool is not None:  # Closed already unless `_train` was not reached.
            pool.close()
    evals = [result for result in results if result.name == "eval"]
    trains = [result for result in results if result.name == "train"]
    if trains:
        steps = sum(result.steps for result in trains)
        seconds = sum(result.seconds for result in trains)
        print(f"Trained {steps:,} steps at {steps / max(seconds, 1e-9):,.0f} steps/s "
              f"(including updates).")
    if evals:
        print(f"Final eval mean_score {evals[-1].mean_score:.1f} at step "
              f"{evals[-1].global_step:,}.")
    if config.eager:
        print(f"Ran eagerly (no tf.function traced). TensorBoard: tensorboard "
              f"--logdir={args.logdir}")
        return 0
    print(f"tf.function traces: {loop.tracing_count()} (train and eval phases share it, "
          f"{loop.tracing_seconds:.1f} s to trace and optimize; one call per "
          f"{config.steps_per_call} batch step{'s' if config.steps_per_call > 1 else ''}). "
          f"TensorBoard: tensorboard --logdir={args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

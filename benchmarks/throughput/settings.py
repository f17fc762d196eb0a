"""The throughput benchmark's settings (`python -m benchmarks.throughput`): the measurement
kinds and their baselines, the configs, the default and quick settings, the learning
measurement, the paired comparisons and the goals."""

# Measurement kinds, in report order, with their descriptions.
KINDS = {
    "single_env": "1 env, plain Python loop (per-core reference)",
    "single_env_per_core": "1 env per core, plain Python loops in `os.cpu_count()` processes "
                           "at once (the core limit, measured)",
    "batch_env": "BatchEnv, in-process (blocking); for `envpool:TASK`, the EnvPool batch "
                 "(C++ threads) stepped from Python",
    "batch_env_processes": "BatchEnv, one ExternalProcess worker per env (non-blocking)",
    "parallel_batch_env": "ParallelBatchEnv, one worker per core hosting several envs, "
                          "shared memory",
    "sync_vector_env": "Gymnasium SyncVectorEnv",
    "async_vector_env": "Gymnasium AsyncVectorEnv (forkserver)",
    "simulate_mock": "simulate + MockAlgorithm, in-process BatchEnv, 1 step per call",
    "simulate_mock_loop": "simulate + MockAlgorithm, in-process (an in-graph env: XLA), "
                          "K steps per call",
    "simulate_mock_processes": "simulate + MockAlgorithm, ParallelBatchEnv as training "
                               "makes it (`env_backend: processes`), K steps per call",
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
                "batchrl.native_tasks:Pendulum": "pendulum_native",
                "envpool:HalfCheetah-v5": "cheetah"}

DEFAULTS = dict(envs=["Pendulum-v1", "HalfCheetah-v5", "batchrl.native_tasks:Pendulum",
                      "envpool:HalfCheetah-v5"],
                sizes=[8, 32, 128], native_sizes=[32, 4096], steps_per_call=100, seconds=2.0,
                warmup=1.0, min_updates=1, repeats=5, inter_op_threads=None,
                learning_seeds=[0, 1, 2], learning_steps=400_000, pair_seconds=20.0)
QUICK = dict(envs=["Pendulum-v1", "HalfCheetah-v5", "batchrl.native_tasks:Pendulum",
                   "envpool:Pendulum-v1"], sizes=[2, 4],
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
    ("envpool:HalfCheetah-v5", 32, "simulate_mock_loop", "batch_env"),
    ("envpool:HalfCheetah-v5", 32, "simulate_mock_loop", "single_env"),
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
    dict(what="`simulate` + MockAlgorithm, EnvPool HalfCheetah-v5 (`envpool:`), 32 envs, K "
              "steps per call, vs EnvPool's own batch stepping (paired windows; issue 16)",
         env="envpool:HalfCheetah-v5", num_envs=32, measure="paired",
         kind="simulate_mock_loop", baseline="batch_env", target=0.8),
    dict(what="the same, vs Gymnasium's 2-core raw limit (paired windows with one "
              "Gymnasium HalfCheetah-v5 in a plain loop, times 2; issue 16)",
         env="envpool:HalfCheetah-v5", num_envs=32, measure="paired",
         kind="simulate_mock_loop", baseline="single_env", target=1.2),
    dict(what="`simulate` + MockAlgorithm, in-graph Pendulum, 4,096 envs (XLA): steps/s",
         env="batchrl.native_tasks:Pendulum", num_envs=4096, measure="steps_per_second",
         kind="simulate_mock_loop", target=1_000_000),
    dict(what=f"BatchPPO on the in-graph Pendulum (`{LEARNING_CONFIG}`): wall-clock seconds "
              f"from the training command's start to the first eval return >= "
              f"{LEARNING_THRESHOLD:g}, every seed",
         measure="seconds_to_threshold", target=120.0),
]

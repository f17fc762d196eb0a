"""Where `simulate`'s time per batch step goes, beyond the environments' own step.

    .venv/bin/python -m benchmarks.simulate_overhead [--env Pendulum-v1] [--num-envs 32]

The paired windows of `python -m benchmarks.throughput` give the ratio of `simulate` to raw
stepping within a few percent, which the host's drift moves by as much. This measures the
time TensorFlow's thread spends between two calls of the environments (`InGraphBatchEnv`'s
`tf.numpy_function`), timestamped inside the call: the median of thousands of such gaps
moves by about a microsecond between runs. Each row adds one layer to the loop of
`steps_per_call` batch steps that the training loop runs, with the inter-op threads that
training uses for in-process environments (one):

- `numpy_function`: a `tf.while_loop` drawing random actions and calling the environments'
  step through `tf.numpy_function`, nothing else;
- `batch variables`: `InGraphBatchEnv.simulate`, which also stores the step's results in
  the batch's variables;
- `simulate`: the training loop's step function (`batchrl.drivers.loop.step_function`) with
  `MockAlgorithm`: episodes begun and ended, scores, the rows it returns.

Also printed: the environments' own step (`BatchEnv.step`, timed inside the same calls),
the Python of `InGraphBatchEnv._step` around it, and the ratio of `simulate` to raw
stepping that these imply. Times are medians in microseconds per batch step.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Before TensorFlow's import.


def _timestamped(function, marks):
    """`function` that appends `time.perf_counter()` to `marks` on entry and on return."""

    def timed(*args):
        marks.append(time.perf_counter())
        try:
            return function(*args)
        finally:
            marks.append(time.perf_counter())

    return timed


def _loops(batch_env, steps_per_call):
    """The three loops of the module's docstring, each a zero-argument callable running one
    call of `steps_per_call` batch steps over the in-graph `batch_env`."""
    import tensorflow as tf

    from batchrl.drivers.loop import step_function
    from batchrl.tools.mock_algorithm import MockAlgorithm

    algo = MockAlgorithm(batch_env, seed=0)
    all_indices = tf.range(len(batch_env))

    def loop(body):
        @tf.function(autograph=False)
        def run():
            def step(index):
                with tf.control_dependencies(body(algo.perform(all_indices, None))):
                    return index + 1

            return tf.while_loop(lambda index: index < steps_per_call, step,
                                 [tf.constant(0)])

        return lambda: run()[0].numpy()

    dtypes = [batch_env.observ.dtype, tf.float32]
    full = step_function(batch_env, algo, steps_per_call)
    no, count = tf.constant(False), tf.constant(steps_per_call)
    return {
        "numpy_function": loop(lambda action: tf.numpy_function(
            batch_env._step, [action], dtypes)),
        "batch variables": loop(lambda action: [batch_env.simulate(action)]),
        "simulate": lambda: full(no, no, count)[0].numpy(),
    }


def measure(env_id, num_envs, steps_per_call=50, calls=40):
    """Runs each loop `calls` times, in turn; returns `{row: median microseconds}` for
    the rows of the module's docstring and `environment step` and `_step's Python`.

    Raises:
      ConfigError: an unknown environment id.
    """
    from batchrl.environments.in_graph import InGraphBatchEnv
    from batchrl.scripts.train import set_inter_op_threads
    from benchmarks.throughput import baselines

    set_inter_op_threads(1)  # Warns, and keeps the pool, where TensorFlow already runs.
    with baselines.open_batch_env(baselines.env_config(env_id, num_envs, False)) as (
            batch, _):
        marks, inner = [], []
        batch.step = _timestamped(batch.step, inner)
        batch_env = InGraphBatchEnv(batch)
        batch_env._step = _timestamped(batch_env._step, marks)
        loops = _loops(batch_env, steps_per_call)
        for run in loops.values():  # Traced, and the first episodes begun.
            run()
        gaps = {name: [] for name in loops}
        steps, durations = [], []
        for _ in range(calls):
            for name, run in loops.items():
                marks.clear()
                inner.clear()
                run()
                gaps[name] += [b - a for a, b in zip(marks[1:-1:2], marks[2::2], strict=True)]
                steps += [b - a for a, b in zip(inner[::2], inner[1::2], strict=True)]
                durations += [b - a for a, b in zip(marks[::2], marks[1::2], strict=True)]
    result = {"environment step": statistics.median(steps) * 1e6,
              "_step's Python": (statistics.median(durations) - statistics.median(steps)) * 1e6}
    result.update((name, statistics.median(values) * 1e6) for name, values in gaps.items())
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.simulate_overhead",
        description="Microseconds per batch step that simulate spends between two calls "
                    "of the environments, layer by layer (medians).")
    parser.add_argument("--env", default="Pendulum-v1", help="a Gymnasium id")
    parser.add_argument("--num-envs", type=int, default=32, help="the batch size")
    parser.add_argument("--steps-per-call", type=int, default=50,
                        help="batch steps per call of each loop")
    parser.add_argument("--calls", type=int, default=40, help="timed calls of each loop")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = measure(args.env, args.num_envs, args.steps_per_call, args.calls)
    print(f"{args.env}, {args.num_envs} environments, {args.steps_per_call} steps per call, "
          f"{args.calls} calls of each loop ({time.perf_counter() - started:.0f} s):")
    for name, micros in result.items():
        what = "" if name in ("environment step", "_step's Python") else " between calls"
        print(f"  {name + what:<32} {micros:8.1f} µs")
    step = result["environment step"]
    ratio = step / (step + result["_step's Python"] + result["simulate"])
    print(f"  simulate / raw stepping, so implied: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

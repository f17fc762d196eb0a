"""Would asynchronous EnvPool stepping make `simulate` faster here? An upper bound.

    .venv/bin/python scripts/envpool_async_benchmark.py
    .venv/bin/python scripts/envpool_async_benchmark.py --task HalfCheetah-v5 \\
        --policy-us 0 25 --seconds 20

EnvPool's asynchronous mode (`batch_size` < `num_envs`) returns whichever `batch_size`
environments are ready, so that the learner acts on those while EnvPool's threads step the
others. `simulate` would then run on a part of the batch at a time, with the algorithm
acting on those agents' indices. Before building that, this measures what it can gain at
best: EnvPool stepped from a plain Python loop, with the learner's work per batch step
replaced by a busy wait of `--policy-us` microseconds per environment (it holds a core, as
TensorFlow's inference and `simulate`'s bookkeeping do; `docs/performance.md` puts them at
about 25 us per HalfCheetah environment step on 2 cores), in:

- `sync`: `num_envs` environments, all stepped together (`batch_size = num_envs`, what
  `EnvPoolBatchEnv` does);
- `async N/B`: N environments, B returned per call (`send` / `recv`), for the `--layouts`.

All variants of one policy cost are timed in alternating windows of 0.25 s for
`--seconds` seconds (the host's speed drifts), with `--threads` EnvPool threads (default:
the core count). Prints steps/s and each variant's median window ratio to `sync`.
"""

import argparse
import os
import sys
import time
import warnings

import numpy as np
from parallel_step_benchmark import compute
from throughput_baselines import _window


def _make(task, num_envs, batch_size, threads):
    import envpool

    with warnings.catch_warnings():  # EnvPool's float64 space bounds, cast by Gymnasium.
        warnings.filterwarnings("ignore", message=".*precision lowered")
        pool = envpool.make_gymnasium(task, num_envs=num_envs, batch_size=batch_size,
                                      num_threads=threads, seed=0)
        _ = pool.action_space, pool.observation_space  # Built once, kept by the pool.
    return pool


def _sync_stepper(task, num_envs, threads, policy_us):
    pool = _make(task, num_envs, num_envs, threads)
    actions = np.zeros((num_envs, *pool.action_space.shape))
    pool.reset()

    def call():
        compute(policy_us * num_envs)
        pool.step(actions)
        return num_envs

    return call, pool


def _async_stepper(task, num_envs, batch_size, threads, policy_us):
    pool = _make(task, num_envs, batch_size, threads)
    actions = np.zeros((batch_size, *pool.action_space.shape))
    pool.async_reset()

    def call():
        info = pool.recv()[-1]
        compute(policy_us * batch_size)
        pool.send(actions, info["env_id"])
        return batch_size

    return call, pool


def measure(task, num_envs, layouts, threads, policy_us, seconds, window=0.25):
    """Steps/s of `sync` and each `async N/B` layout, timed in alternating windows.

    Returns:
      dict name -> (steps/s over all windows, median ratio of its windows to `sync`'s).
    """
    steppers = {"sync": _sync_stepper(task, num_envs, threads, policy_us)}
    for envs, batch in layouts:
        steppers[f"async {envs}/{batch}"] = _async_stepper(task, envs, batch, threads,
                                                           policy_us)
    try:
        for call, _ in steppers.values():
            _window(call, 0.2)  # Warm up.
        totals = {name: [0, 0.0] for name in steppers}
        ratios = {name: [] for name in steppers}
        end = time.perf_counter() + seconds
        round_ = 0
        while time.perf_counter() < end or round_ < 2:
            names = list(steppers) if round_ % 2 == 0 else list(steppers)[::-1]
            rates = {}
            for name in names:
                steps, elapsed, _ = _window(steppers[name][0], window)
                totals[name][0] += steps
                totals[name][1] += elapsed
                rates[name] = steps / elapsed
            for name in steppers:
                ratios[name].append(rates[name] / rates["sync"])
            round_ += 1
    finally:
        for _, pool in steppers.values():
            pool.close()
    return {name: (totals[name][0] / totals[name][1], float(np.median(ratios[name])))
            for name in steppers}


def _layout(text):
    try:
        envs, batch = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N/B, e.g. 64/32, got {text!r}") from None
    if not 0 < batch < envs:
        raise argparse.ArgumentTypeError(f"need 0 < B < N, got {text!r}")
    return envs, batch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="HalfCheetah-v5", help="EnvPool task id")
    parser.add_argument("--num-envs", type=int, default=32, help="environments of `sync`")
    parser.add_argument("--layouts", type=_layout, nargs="+", default=[(32, 16), (64, 32)],
                        metavar="N/B", help="async layouts: N environments, B per call "
                                            "(default: 32/16 64/32)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="EnvPool threads (default: the core count)")
    parser.add_argument("--policy-us", type=float, nargs="+", default=[0.0, 25.0],
                        help="the learner's busy wait per environment step, microseconds "
                             "(default: 0 25)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="timed seconds per policy cost (default: %(default)s)")
    args = parser.parse_args(argv)
    print(f"{args.task}, {args.threads} EnvPool threads, {os.cpu_count()} cores")
    for policy_us in args.policy_us:
        results = measure(args.task, args.num_envs, args.layouts, args.threads, policy_us,
                          args.seconds)
        for name, (rate, ratio) in results.items():
            print(f"policy {policy_us:5.1f} us/env  {name:<14} {rate:>10,.0f} steps/s  "
                  f"{ratio:.2f}x sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())

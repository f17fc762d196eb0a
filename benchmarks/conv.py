"""The PPO minibatch step's arithmetic rate on a config's declared (convolutional) network
beside the cores' own matmul rate.

    python -m benchmarks.conv                        # pong
    python -m benchmarks.conv --config minatar_breakout

In one process, alternating `--repeats` times so that both see the same host:
- step: the config's PPO built on the config's environment, `--steps` of its minibatch
  optimizer steps (`_steps`: the joint step with `share_layers`, else a value step and a
  policy step) on a minibatch of `batch_size` random observations, in one compiled loop;
- matmul: the chain of `[B, 256] x [256, 256]` float32 products of
  `benchmarks.off_policy` (B = `batch_size`), compiled with XLA.
The step's FLOPs are those TensorFlow's profiler counts in one forward pass of the networks
(the convolutions' and dense layers' multiply-adds, 2 FLOPs each; with `share_layers` the
shared layers once), times 3 for the forward and backward pass (the gradients of the
weights and of the inputs each cost about one forward pass), times `batch_size`.
Reported: both rates (medians), their ratio, minibatch steps/s, and the hours per 1M
environment steps that the update's minibatch steps alone take (`update_epochs` passes over
each step).
"""

import argparse
import contextlib
import statistics

import numpy as np
import tensorflow as tf

from batchrl import build, configs, environments
from batchrl.algorithms import parts
from benchmarks.off_policy import _matmul_chain, _timed, profiled_flops


def forward_flops(networks, observation_shape):
    """FLOPs of one forward pass of the policy and the value network on one observation,
    as TensorFlow's profiler counts them (ops with registered FLOP statistics: convolutions,
    matrix products, bias additions); a shared torso counted once."""
    torso = parts.shared_torso(networks)

    def forward(observ):
        with torso.reused() if torso is not None else contextlib.nullcontext():
            params, _ = networks.policy(observ, tf.zeros([1, networks.policy.state_size]))
            return params, networks.value(observ)

    return profiled_flops(forward, tf.TensorSpec((1, 1) + tuple(observation_shape), tf.float32))


def _minibatch(algo, batch_size, seed=0):
    """A minibatch of `batch_size` one-step chunks of random observations, as `_optimize`
    gives `_steps`."""
    rng = np.random.default_rng(seed)
    space = algo._batch_env.observation_space
    shape = (batch_size, 1)
    if np.issubdtype(space.dtype, np.integer):
        observ = rng.integers(0, 256, shape + space.shape).astype(space.dtype)
    else:
        observ = rng.normal(size=shape + space.shape).astype(np.float32)
    observ = tf.constant(observ)
    params, _ = algo.networks.policy(observ, tf.zeros([batch_size, 0]))
    action = algo._distribution(params).sample(tf.random.Generator.from_seed(seed))
    minibatch = {
        "observ": observ, "action": action, "state": tf.zeros(shape + (0,)),
        "mask": tf.ones(shape), "target": tf.constant(rng.normal(size=shape), tf.float32),
        "advantage": tf.constant(rng.normal(size=shape), tf.float32),
        "old_log_prob": algo._distribution(params).log_prob(action)}
    minibatch.update({"reference_" + key: value for key, value in params.items()})
    return minibatch


def measure(config, steps, repeats):
    """The figures of the module docstring, as a dict."""
    batch_env = environments.create_batch(config)
    try:
        algo = build.build(config, batch_env).algo
        batch_size = int(config.batch_size or 256)
        minibatch = _minibatch(algo, batch_size)

        @tf.function
        def train(count):
            def body(index):
                losses, _ = algo._steps(minibatch)
                with tf.control_dependencies(tf.nest.flatten(losses)):
                    return index + 1
            return tf.while_loop(lambda index: index < count, body, [0])

        per_step = 3.0 * batch_size * forward_flops(
            algo.networks, algo._batch_env.observation_space.shape)
        chain, chain_flops = _matmul_chain(batch_size)
        count = tf.constant(steps)
        compile_seconds = _timed(train, count)
        _timed(chain, tf.constant(10))
        step_rates, matmul_rates = [], []
        chain_repeats = max(10, int(steps * per_step / chain_flops))
        for _ in range(repeats):
            step_rates.append(steps / _timed(train, count))
            matmul_rates.append(
                chain_repeats * chain_flops / _timed(chain, tf.constant(chain_repeats)))
    finally:
        batch_env.close()
    rate, matmul = statistics.median(step_rates), statistics.median(matmul_rates)
    update_steps = config.update_epochs * 1e6 / batch_size
    return {
        "network": "shared" if config.share_layers else "separate",
        "batch_size": batch_size, "step_gflop": per_step / 1e9, "steps_per_second": rate,
        "step_gflops": rate * per_step / 1e9, "matmul_gflops": matmul / 1e9,
        "ratio": rate * per_step / matmul,
        "hours_per_million_steps": update_steps / rate / 3600,
        "compile_seconds": compile_seconds, "update_epochs": config.update_epochs,
    }


def report(result):
    """The lines printed for `measure`'s result."""
    r = result
    return "\n".join([
        f"minibatch step ({r['network']} layers, batch {r['batch_size']}): "
        f"{r['step_gflop']:.2f} GFLOP (first call, with tracing: "
        f"{r['compile_seconds']:.1f} s)",
        f"step: {r['steps_per_second']:.1f} steps/s = {r['step_gflops']:.1f} GFLOP/s; "
        f"matmul chain: {r['matmul_gflops']:.1f} GFLOP/s; ratio {r['ratio']:.2f}",
        f"minibatch steps alone ({r['update_epochs']} epochs): "
        f"{r['hours_per_million_steps']:.2f} h per 1M environment steps",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.conv", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="pong", help="config name or path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, as for train")
    parser.add_argument("--steps", type=int, default=20, help="minibatch steps per timed call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each")
    args = parser.parse_args(argv)
    config = configs.load(args.config, configs.parse_overrides(args.set))
    print(report(measure(config, args.steps, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

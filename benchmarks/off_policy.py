"""The off-policy update's arithmetic rate beside the cores' own matmul rate, and the replay
memory's bytes per transition.

    python -m benchmarks.off_policy                      # cheetah_sac
    python -m benchmarks.off_policy --config cartpole_dqn --set batch_size=256

In one process, alternating `--repeats` times so that both see the same host:
- matmul: a chain of `[B, 256] x [256, 256]` float32 products with ReLU (B = the config's
  batch size), compiled with XLA: the cores' rate on the update's own matrix sizes;
- update: the config's algorithm built on the config's environment, its replay memory
  filled with random transitions, `--updates` updates per call of its compiled update.
  Its FLOPs are counted per network pass (2 per multiply-add; see `update_flops`), so its
  GFLOP/s over the matmul's is the fraction of the cores' rate the update reaches.
Reported: both rates (medians), their ratio, updates/s and hours per 1M environment steps
at the config's `updates_per_step` (updates only, no environment), and the memory's bytes
per transition and for `replay_capacity` transitions.
"""

import argparse
import math
import statistics
import time

import numpy as np
import tensorflow as tf

from batchrl import build, configs, environments


def _dense_macs(model):
    """Multiply-adds per sample of a model's dense layers (kernels `[in, out]`, and
    `[heads, in, out]` for stacked heads)."""
    return sum(math.prod(v.shape) for v in model.trainable_variables
               if "kernel" in v.name)


def profiled_flops(function, *specs):
    """FLOPs of `function` traced on inputs of the `tf.TensorSpec`s `specs`, as TensorFlow's
    profiler counts them: the ops with registered FLOP statistics (convolutions and matrix
    products, 2 FLOPs per multiply-add; bias additions, 1 per element)."""
    graph = tf.function(function).get_concrete_function(*specs).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # The v1 profiler warns that its own helpers are deprecated.
    try:
        return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops
    finally:
        logger.setLevel(level)


def update_flops(algo, batch_size):
    """FLOPs of one update of `algo` (SAC, TD3 or DQN) on `batch_size` transitions.

    With A the actor's and C the critic's (both Q heads) FLOPs per sample, and a backward
    pass costing two forward passes (gradients of the weights and of the inputs): SAC runs
    the actor and the target critic on s' (A + C), trains the critic (3C), and trains the
    actor through the critic (3A + 2C): 4A + 6C; TD3 the same but the actor's step every
    `policy_delay` updates; DQN the online and target Q on s' and a training pass (5Q).
    SAC's and TD3's networks are MLPs: A and C are 2 FLOPs per multiply-add of their dense
    layers. DQN's Q network may be convolutional: Q is `profiled_flops` of its forward
    pass on one observation (the kernels' sizes alone, as for an MLP, would count each
    convolution once per image instead of once per output position).
    """
    networks = algo.networks
    if algo.name == "dqn":
        observ = tf.TensorSpec((1,) + tuple(algo._observ_shape), tf.float32)
        return 5.0 * profiled_flops(networks.policy, observ) * batch_size
    actor, critic = _dense_macs(networks.policy), _dense_macs(networks.critic)
    delay = int(algo._config.policy_delay) if algo.name == "td3" else 1
    macs = actor + critic + 3 * critic + (3 * actor + 2 * critic) / delay
    return 2.0 * macs * batch_size


def _matmul_chain(batch_size, width=256, depth=8):
    kernels = [tf.Variable(tf.random.normal([width, width], stddev=width ** -0.5))
               for _ in range(depth)]
    inputs = tf.random.normal([batch_size, width])

    @tf.function(jit_compile=True)
    def chain(repeats):
        def body(index, hidden):
            for kernel in kernels:
                hidden = tf.nn.relu(tf.matmul(hidden, kernel))
            return index + 1, hidden
        return tf.while_loop(lambda i, _: i < repeats, body, (0, inputs))[1]

    return chain, 2.0 * batch_size * width * width * depth


def _timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    tf.nest.map_structure(lambda x: x.numpy(), result)
    return time.perf_counter() - start


def _filled(algo, count, seed=0):
    """Fills the replay memory with `count` random transitions of the algorithm's shapes
    (with `replay_frame_stack`, every frame new: as many a write as its window takes)."""
    memory, rng = algo.memory, np.random.default_rng(seed)
    observ_shape = tuple(algo._observ_shape)
    action = tf.TensorSpec(algo._action_shape, algo._batch_env.action.dtype)
    chunk = 10000
    if memory.frame_stack:
        chunk = memory.frame_stack["window"] // (2 * memory.frame_stack["frames"])
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        if action.dtype.is_floating:
            actions = rng.uniform(-1, 1, (n, *action.shape)).astype(np.float32)
        else:
            actions = rng.integers(0, algo._batch_env.action_space.n, n).astype(np.int32)
        memory.insert({
            "observ": rng.normal(size=(n, *observ_shape)).astype(np.float32),
            "action": actions, "reward": rng.normal(size=n).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32),
            "nextob": rng.normal(size=(n, *observ_shape)).astype(np.float32)})


def measure(config, updates, repeats, fill):
    """The figures of the module docstring, as a dict."""
    batch_env = environments.create_batch(config)
    try:
        algo = build.build(config, batch_env).algo
        _filled(algo, fill)
        batch_size = algo._batch_size
        chain, chain_flops = _matmul_chain(batch_size)
        count = tf.constant(updates)
        compile_seconds = _timed(algo._update, count)
        _timed(chain, tf.constant(10))
        update_rates, matmul_rates = [], []
        for _ in range(repeats):
            update_rates.append(updates / _timed(algo._update, count))
            chain_repeats = max(10, int(updates * update_flops(algo, batch_size) / chain_flops))
            matmul_rates.append(
                chain_repeats * chain_flops / _timed(chain, tf.constant(chain_repeats)))
        memory = algo.memory
        stored = sum(v.numpy().nbytes for v in memory.variables)
    finally:
        batch_env.close()
    per_update = update_flops(algo, batch_size)
    rate = statistics.median(update_rates)
    matmul = statistics.median(matmul_rates)
    return {
        "algorithm": config.algorithm, "batch_size": batch_size,
        "update_gflop": per_update / 1e9, "updates_per_second": rate,
        "update_gflops": rate * per_update / 1e9, "matmul_gflops": matmul / 1e9,
        "ratio": rate * per_update / matmul,
        "hours_per_million_steps": 1e6 * config.updates_per_step / rate / 3600,
        "compile_seconds": compile_seconds,
        "bytes_per_transition": memory.bytes_per_transition,
        "memory_bytes": stored, "capacity": memory.capacity,
    }


def report(result):
    """The lines printed for `measure`'s result."""
    r = result
    return "\n".join([
        f"{r['algorithm']}, batch {r['batch_size']}: {r['update_gflop']:.3f} GFLOP per update "
        f"(first call, with compilation: {r['compile_seconds']:.1f} s)",
        f"update: {r['updates_per_second']:,.0f} updates/s = {r['update_gflops']:.1f} GFLOP/s; "
        f"matmul chain: {r['matmul_gflops']:.1f} GFLOP/s; ratio {r['ratio']:.2f}",
        f"updates alone: {r['hours_per_million_steps']:.2f} h per 1M environment steps",
        f"replay memory: {r['bytes_per_transition']} bytes per transition; "
        f"{r['memory_bytes'] / 2 ** 30:.3f} GiB for {r['capacity']:,} transitions",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.off_policy", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cheetah_sac", help="config name or path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, as for train")
    parser.add_argument("--updates", type=int, default=200, help="updates per timed call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each")
    parser.add_argument("--fill", type=int, default=100000,
                        help="random transitions put in the memory first")
    args = parser.parse_args(argv)
    config = configs.load(args.config, configs.parse_overrides(args.set))
    print(report(measure(config, args.updates, args.repeats, args.fill)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

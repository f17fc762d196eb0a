"""Time one BatchPPO update (advantages, epochs of minibatch steps, KL) under settings.

    .venv/bin/python scripts/update_benchmark.py --config pendulum \\
        --variant "jit_update=false" --variant "jit_update=true" \\
        --variant "jit_update=true batch_size=null"

Each variant is a set of `KEY=VALUE` overrides applied on top of the config (and of
`--set`); the first variant is the baseline. For each, the agent is built on the config's
real environments, and the update is run `--repeats` times on the same memory: the
`update_every` episodes that the initial policy of the config (with `--set`) played once.
The first call, which traces and compiles, is reported apart. Reported: milliseconds per
update (the median of the repeats) and per Adam step (of the policy and the value
together), and the ratio against the baseline measured in the same process.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_variant(text):
    """`"KEY=VALUE KEY=VALUE"` -> list of `KEY=VALUE` strings (an empty text: none)."""
    return [item for item in text.split() if item]


def _play(config_name, overrides):
    """Episodes of the initial policy for one update: `(episodes, length, final,
    terminated)` as NumPy arrays of `update_every` rows, played by an agent whose memory
    is `num_agents` rows larger, so that it never fills and trains."""
    import tensorflow as tf

    from batchrl import build as build_lib
    from batchrl import configs, environments
    from batchrl.tools.loop import step_function

    config = configs.load(config_name, overrides)
    need = config.update_every
    config["update_every"] = need + config.num_agents
    batch_env = environments.create_batch(config)
    try:
        agent = build_lib.build(config, batch_env)
        algo = agent.algo
        play = step_function(agent.batch_env, algo, steps_per_call=config.steps_per_call)
        reset = True
        while int(algo._memory_index.numpy()) < need:
            play(tf.constant(False), tf.constant(reset), tf.constant(config.steps_per_call))
            reset = False
        episodes, length = algo._memory.data(tf.range(need))
        return ({key: value.numpy() for key, value in episodes.items()}, length.numpy(),
                algo._memory_final.numpy()[:need], algo._memory_terminated.numpy()[:need])
    finally:
        batch_env.close()


def measure(config_name, overrides, repeats, memory):
    """Builds the agent of `config_name` with `overrides` and times its update.

    Returns:
      dict with `first` (seconds of the first call, tracing and compiling included),
      `seconds` (list of the later calls' seconds), `adam_steps` (policy optimizer steps
      per update).
    """
    episodes, length, final, terminated = memory
    import tensorflow as tf

    from batchrl import build as build_lib
    from batchrl import configs, environments

    config = configs.load(config_name, overrides)
    build_lib.check(config)
    batch_env = environments.create_batch(config)
    try:
        agent = build_lib.build(config, batch_env)
        agent.should_log.assign(False)
        algo = agent.algo
        rows = tf.range(config.update_every)

        @tf.function(autograph=False)
        def update():
            stored = [algo._memory.replace(episodes, length, rows),
                      algo._memory_final.assign(final),
                      algo._memory_terminated.assign(terminated),
                      algo._memory_index.assign(config.update_every)]
            with tf.control_dependencies(stored):
                return algo._train()

        times = []
        for _ in range(repeats + 1):
            iterations = int(algo._policy_optimizer.iterations.numpy())
            start = time.perf_counter()
            update()
            times.append(time.perf_counter() - start)
        adam_steps = int(algo._policy_optimizer.iterations.numpy()) - iterations
        return {"first": times[0], "seconds": times[1:], "adam_steps": adam_steps}
    finally:
        batch_env.close()


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="pendulum", help="config name or YAML path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides for every variant (repeatable)")
    parser.add_argument("--variant", action="append", metavar='"KEY=VALUE ..."',
                        help="a set of overrides to compare (repeatable; the first is the "
                             "baseline; default: jit_update=false against true)")
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed updates per variant after the first (default: %(default)s)")
    args = parser.parse_args(argv)
    variants = args.variant or ["jit_update=false", "jit_update=true"]
    from batchrl import configs

    try:
        for variant in variants:
            configs.load(args.config, [*args.set, *parse_variant(variant)])
    except configs.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"config {args.config} {' '.join(args.set)}; {args.repeats} timed updates each")
    print(f"{'variant':<40} {'first s':>8} {'ms/update':>10} {'ms/Adam step':>13} "
          f"{'Adam steps':>10} {'x baseline':>10}")
    baseline = None
    memory = _play(args.config, args.set)
    for variant in variants:
        result = measure(args.config, [*args.set, *parse_variant(variant)], args.repeats,
                         memory)
        median = statistics.median(result["seconds"])
        baseline = baseline or median
        per_step = median / max(result["adam_steps"], 1)
        print(f"{variant or '(config)':<40} {result['first']:>8.2f} {median * 1e3:>10.1f} "
              f"{per_step * 1e3:>13.3f} {result['adam_steps']:>10} {median / baseline:>10.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

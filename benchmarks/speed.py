"""Speed of a config under variants: one BatchPPO update (`update`), or training steps per
second in paired rounds (`training`).

    .venv/bin/python -m benchmarks.speed update --config pendulum \\
        --variant "jit_update=false" --variant "jit_update=true" \\
        --variant "jit_update=true batch_size=null"
    .venv/bin/python -m benchmarks.speed training --config cheetah \\
        --variant "env_backend=processes" --variant "env_backend=local" \\
        --variant "env_backend=envpool" --rounds 3 --steps 100000

Each variant is a set of `KEY=VALUE` overrides (split like a shell's words) applied on top
of the config (and of `--set`); the first variant is the baseline.

`update`: for each variant, the agent is built on the config's real environments, and the
update (advantages, epochs of minibatch steps, KL) is run `--repeats` times on the same
memory: the `update_every` episodes that the initial policy of the config (with `--set`)
played once. The first call, which traces and compiles, is reported apart. Reported:
milliseconds per update (the median of the repeats) and per Adam step (of the policy and the
value together), and the ratio against the baseline measured in the same process.

`training`: a round trains every variant once, one after the other, each in its own `python
-m batchrl.scripts.train` process (a fresh TensorFlow, as a user's run), for `--steps` steps
without evaluation; its figure is the run's training steps/s (updates included) that the
Loop writes to its event files (`batchrl.scripts.run_summary.train_speed`, what the command
prints as "Trained N steps at R steps/s"), which leaves out start-up and tracing.
Reported per variant: every round's steps/s, the median, and the median over rounds of its
ratio to the baseline of the same round (the host's speed drifts between rounds; a ratio
within a round is steadier than one of medians). With `--parallel 2`, two copies of each
variant train at the same time (the figure is their mean), as when several seeds share the
machine.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from batchrl.scripts.run_summary import train_speed

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_variant(text):
    """`"KEY=VALUE KEY=VALUE"` -> list of `KEY=VALUE` strings, split like a shell's words
    (quotes group; an empty text: none)."""
    return shlex.split(text)


# The update.


def play(config_name, overrides):
    """Episodes of the initial policy for one update of `config_name` with `overrides`
    (list of `KEY=VALUE` strings or a dict).

    Returns:
      `(episodes, length, final, terminated)`: NumPy arrays of `update_every` rows (the
      memory's episodes as a dict of `[update_every, max_length, ...]` arrays, their
      lengths, final observations and terminated flags), played by an agent whose memory is
      `num_agents` rows larger, so that it never fills and trains.
    """
    import tensorflow as tf

    from batchrl import build as build_lib
    from batchrl import configs, environments
    from batchrl.drivers.loop import step_function

    config = configs.load(config_name, overrides)
    need = config.update_every
    config["update_every"] = need + config.num_agents
    batch_env = environments.create_batch(config)
    try:
        agent = build_lib.build(config, batch_env)
        algo = agent.algo
        step = step_function(agent.batch_env, algo, steps_per_call=config.steps_per_call)
        reset = True
        while int(algo._memory_index.numpy()) < need:
            step(tf.constant(False), tf.constant(reset), tf.constant(config.steps_per_call))
            reset = False
        episodes, length = algo._memory.data(tf.range(need))
        return ({key: value.numpy() for key, value in episodes.items()}, length.numpy(),
                algo._memory_final.numpy()[:need], algo._memory_terminated.numpy()[:need])
    finally:
        batch_env.close()


def measure_update(config_name, overrides, repeats, memory):
    """Builds the agent of `config_name` with `overrides` and times its update on `memory`
    (from `play`), `repeats` times after a first call.

    Returns:
      dict with `first` (seconds of the first call, tracing and compiling included),
      `seconds` (list of the later calls' seconds), `adam_steps` (policy optimizer steps
      per update).

    Raises:
      ConfigError: a bad config or override.
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
            iterations = int(algo.checkpoint_state["policy_optimizer"].iterations.numpy())
            start = time.perf_counter()
            update()
            times.append(time.perf_counter() - start)
        adam_steps = int(algo.checkpoint_state["policy_optimizer"].iterations.numpy()) - iterations
        return {"first": times[0], "seconds": times[1:], "adam_steps": adam_steps}
    finally:
        batch_env.close()


def run_update(args):
    """The `update` command: prints one row per variant; returns the exit code (2: a bad
    config or override)."""
    from batchrl import configs

    variants = args.variant or ["jit_update=false", "jit_update=true"]
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
    memory = play(args.config, args.set)
    for variant in variants:
        result = measure_update(args.config, [*args.set, *parse_variant(variant)],
                                args.repeats, memory)
        median = statistics.median(result["seconds"])
        baseline = baseline or median
        per_step = median / max(result["adam_steps"], 1)
        print(f"{variant or '(config)':<40} {result['first']:>8.2f} {median * 1e3:>10.1f} "
              f"{per_step * 1e3:>13.3f} {result['adam_steps']:>10} {median / baseline:>10.2f}",
              flush=True)
    return 0


# Training speed.


def train_rate(config, overrides, steps, logdir):
    """Trains `config` with `overrides` for `steps` steps into `logdir`; returns its steps/s.

    Raises:
      RuntimeError: the command failed or wrote no train speed to its event files (its
        output's tail is in the message).
    """
    sets = [f"steps={steps}", f"eval_every={10 * steps}", *overrides]
    command = [sys.executable, "-m", "batchrl.scripts.train", f"--config={config}",
               f"--logdir={logdir}", "--no-progress"]
    for item in sets:
        command += ["--set", item]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    rate = train_speed(logdir) if result.returncode == 0 else None
    if rate is None:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise RuntimeError(f"training with {' '.join(sets)} failed (exit "
                           f"{result.returncode}):\n{tail}")
    return rate


def measure_round(config, variants, steps, parallel, root, round_index):
    """One round: the steps/s of each variant (the mean of `parallel` simultaneous runs)."""
    rates = []
    for k, overrides in enumerate(variants):
        logdirs = [os.path.join(root, f"round{round_index}-variant{k}-copy{c}")
                   for c in range(parallel)]
        with ThreadPoolExecutor(parallel) as pool:
            copies = list(pool.map(train_rate, [config] * parallel, [overrides] * parallel,
                                   [steps] * parallel, logdirs))
        rates.append(statistics.fmean(copies))
    return rates


def report(config, names, rounds, steps, parallel):
    """Markdown: a table of steps/s per round, medians and paired ratios to the baseline."""
    lines = [f"`{config}`, {steps:,} steps per run, {len(rounds)} round(s)"
             + (f", {parallel} runs of a variant at a time" if parallel > 1 else "") + ".",
             "", "| variant | steps/s per round | median | ratio to the first (median of "
             "rounds) |", "|---|---|---|---|"]
    for k, name in enumerate(names):
        rates = [row[k] for row in rounds]
        ratios = [row[k] / row[0] for row in rounds]
        lines.append(f"| {name} | {' / '.join(f'{r:,.0f}' for r in rates)} | "
                     f"{statistics.median(rates):,.0f} | {statistics.median(ratios):.2f}× "
                     f"({min(ratios):.2f}–{max(ratios):.2f}) |")
    return "\n".join(lines) + "\n"


def run_training(args):
    """The `training` command: prints each round and the table; returns the exit code."""
    variants = [args.set + parse_variant(text) for text in args.variant]
    names = [text or "(the config)" for text in args.variant]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="batchrl-training-speed-") as root:
        for r in range(args.rounds):
            rates = measure_round(args.config, variants, args.steps, args.parallel, root, r)
            print(f"round {r + 1}/{args.rounds}: "
                  + ", ".join(f"{name}: {rate:,.0f} steps/s"
                              for name, rate in zip(names, rates, strict=True)), flush=True)
            rounds.append(rates)
    table = report(args.config, names, rounds, args.steps, args.parallel)
    print(table)
    if args.output:
        with open(args.output, "w") as file:
            file.write(table)
    return 0


def _parser():
    parts = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speed", description=parts[0],
        epilog="\n\n".join(parts[1:3]), formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    update = commands.add_parser(
        "update", help="time one BatchPPO update under variants", description=parts[3],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    update.add_argument("--config", default="pendulum", help="config name or YAML path")
    update.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides for every variant (repeatable)")
    update.add_argument("--variant", action="append", metavar='"KEY=VALUE ..."',
                        help="a set of overrides to compare (repeatable; the first is the "
                             "baseline; default: jit_update=false against true)")
    update.add_argument("--repeats", type=int, default=10,
                        help="timed updates per variant after the first (default: %(default)s)")
    training = commands.add_parser(
        "training", help="training steps/s of variants in paired rounds; prints a Markdown "
        "table", description=parts[4], formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_argument("--config", required=True, help="a config name or YAML path")
    training.add_argument("--variant", action="append", required=True, metavar='"K=V ..."',
                          help="overrides of one variant (repeatable; the first is the "
                               "baseline; \"\" for the config as it is)")
    training.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="overrides of every variant (repeatable)")
    training.add_argument("--steps", type=int, default=100_000,
                          help="training steps of each run (default: 100,000)")
    training.add_argument("--rounds", type=int, default=3, help="rounds (default: 3)")
    training.add_argument("--parallel", type=int, default=1,
                          help="runs of a variant at the same time (default: 1)")
    training.add_argument("--output", help="also write the table to this Markdown file")
    return parser


def main(argv=None):
    """Runs the command of `argv` (default: `sys.argv[1:]`); returns its exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "update":
        return run_update(args)
    if args.steps <= 0 or args.rounds <= 0 or args.parallel <= 0:
        parser.error("--steps, --rounds and --parallel must be positive")
    return run_training(args)


if __name__ == "__main__":
    sys.exit(main())

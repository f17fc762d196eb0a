"""Training steps per second of one config under variants, paired in alternating rounds.

    .venv/bin/python scripts/training_speed.py --config cheetah \\
        --variant "env_backend=processes" --variant "env_backend=local" \\
        --variant "env_backend=envpool" --rounds 3 --steps 100000

Each variant is a set of `KEY=VALUE` overrides applied on top of the config (and of
`--set`); the first is the baseline. A round trains every variant once, one after the other,
each in its own `python -m batchrl.scripts.train` process (a fresh TensorFlow, as a user's
run), for `--steps` steps without evaluation; its figure is the command's own "Trained N
steps at R steps/s (including updates)", which leaves out start-up and tracing. Reported per
variant: every round's steps/s, the median, and the median over rounds of its ratio to the
baseline of the same round (the host's speed drifts between rounds; a ratio within a round
is steadier than one of medians). With `--parallel 2`, two copies of each variant train at
the same time (the figure is their mean), as when several seeds share the machine.
"""

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

_TRAINED = re.compile(r"Trained ([\d,]+) steps at ([\d,]+) steps/s")


def parse_variant(text):
    """`"KEY=VALUE KEY=VALUE"` -> list of `KEY=VALUE` strings (an empty text: none)."""
    return shlex.split(text)


def train_rate(config, overrides, steps, logdir):
    """Trains `config` with `overrides` for `steps` steps into `logdir`; returns its steps/s.

    Raises:
      RuntimeError: the command failed or printed no "Trained" line (its output's tail is
        in the message).
    """
    sets = [f"steps={steps}", f"eval_every={10 * steps}", *overrides]
    command = [sys.executable, "-m", "batchrl.scripts.train", f"--config={config}",
               f"--logdir={logdir}", "--no-progress"]
    for item in sets:
        command += ["--set", item]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    match = _TRAINED.search(result.stdout)
    if result.returncode != 0 or not match:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise RuntimeError(f"training with {' '.join(sets)} failed (exit "
                           f"{result.returncode}):\n{tail}")
    return float(match.group(2).replace(",", ""))


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


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Prints a Markdown table.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a config name or YAML path")
    parser.add_argument("--variant", action="append", required=True, metavar='"K=V ..."',
                        help="overrides of one variant (repeatable; the first is the "
                             "baseline; \"\" for the config as it is)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides of every variant (repeatable)")
    parser.add_argument("--steps", type=int, default=100_000,
                        help="training steps of each run (default: 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default: 3)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="runs of a variant at the same time (default: 1)")
    parser.add_argument("--output", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    if args.steps <= 0 or args.rounds <= 0 or args.parallel <= 0:
        parser.error("--steps, --rounds and --parallel must be positive")
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


if __name__ == "__main__":
    sys.exit(main())

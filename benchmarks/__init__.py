"""Measuring programs of batchrl, run from the repository root (not part of the installed
package):

    .venv/bin/python -m benchmarks.throughput            # steps/s against baselines (make bench)
    .venv/bin/python -m benchmarks.throughput breakdown  # where a training run's time goes
    .venv/bin/python -m benchmarks.speed update ...      # one PPO update under settings
    .venv/bin/python -m benchmarks.speed training ...    # training steps/s of variants
    .venv/bin/python -m benchmarks.faults                # random faults and what they cost
    .venv/bin/python -m benchmarks.ray_scaling           # the Ray backend; scaling out
    .venv/bin/python -m benchmarks.actor_scaling         # actors and a learner; scaling out
    .venv/bin/python -m benchmarks.rllib_appo            # cartpole_impala beside RLlib's APPO

Each program's `--help` and module docstring say what it measures and where it writes.
"""

import json
import os
import pathlib

# The repository root: the folder that holds this package.
ROOT = pathlib.Path(__file__).resolve().parents[1]


def child_environment(**variables):
    """The environment of a process that imports this package from any working directory
    (a `python -m benchmarks...` command, an environment worker or Ray actor that builds
    `benchmarks.faults.envs` or `benchmarks.slow_envs` environments).

    Args:
      **variables: environment variables (str values) to set as well.

    Returns:
      dict: `os.environ` with `variables` set and `ROOT` first on `PYTHONPATH`.
    """
    env = dict(os.environ, **variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def replace_marked(path, section, begin, end):
    """Replaces the part of the file `path` from marker `begin` to marker `end` (both
    included) with `section` (which holds them), or appends `section`: how the measuring
    programs rewrite their section of a docs page and leave the rest as it is."""
    path = pathlib.Path(path)
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(text)


def add_publish_flags(parser, json_path, sections):
    """Adds the flags that `publish` reads to the argparse `parser`: `--write` (keep the
    figures in `json_path` and rewrite `sections`, str: the docs' sections it names, e.g.
    "the section of docs/scaling.md") and `--report-only` (no measurement)."""
    name = pathlib.Path(json_path).name
    parser.add_argument("--write", action="store_true",
                        help=f"write docs/{name} and {sections}")
    parser.add_argument("--report-only", action="store_true",
                        help=f"no measurement: report docs/{name}")


def publish(args, json_path, measure, sections):
    """What a measuring program's `main` does with its figures: reads them from `json_path`
    (`args.report_only`) or measures them (`measure(args)`), prints each section of
    `sections(figures)` (a list of `(page, text, begin, end)`: a docs page, its marked
    section), and with `args.write` keeps measured figures in `json_path` and rewrites each
    section of its page (`replace_marked`). Returns the figures."""
    json_path = pathlib.Path(json_path)
    figures = json.loads(json_path.read_text()) if args.report_only else measure(args)
    parts = sections(figures)
    for _, text, _, _ in parts:
        print(text)
    if args.write:
        if not args.report_only:
            json_path.write_text(json.dumps(figures, indent=2) + "\n")
            print(f"Wrote {json_path}.")
        for page, text, begin, end in parts:
            replace_marked(page, text, begin, end)
            print(f"Wrote the section of {page}.")
    return figures

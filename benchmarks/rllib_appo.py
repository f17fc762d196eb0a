"""batchrl's `cartpole_impala` beside RLlib's APPO on CartPole-v1, one after the other in
one command on this machine (docs/distributed.md, "Against RLlib's APPO").

    .venv/bin/python -m benchmarks.rllib_appo --write       # measure; write the docs
    .venv/bin/python -m benchmarks.rllib_appo --report-only --write  # from the JSON

1. The peer's environment: a virtualenv (`--peer-venv`) made once with
   `pip install torch==2.13.0 ray[rllib]==2.60.0` (torch 2.13's CPU build, which this
   machine kind keeps on disk for pip; elsewhere pip downloads it).
2. RLlib: `benchmarks.rllib_peer` in that environment (RLlib's tuned CartPole-v1 settings,
   `--env-runners` env runners and a learner, see its docstring) for `--seconds` seconds
   of training: its sampled env steps/s (env steps over the training seconds, start-up
   left out), its last and best `episode_return_mean` (the sampling policy's), and the
   training seconds to a first return >= 450 (its tuned example's stop criterion), if
   reached.
3. batchrl: `batchrl-train --config=cartpole_impala` (one Ray actor and the learner) for
   each of `--seeds`, in LOGDIR/cartpole_impala/seed-N (`batchrl.scripts.benchmark`'s
   layout), summarized as `batchrl-benchmark` summarizes runs: train steps/s with the
   updates, training seconds to an eval return of 500 (the mode action, 16 episodes).

The ratio reported is batchrl's train steps/s (median over seeds) over RLlib's sampled env
steps/s. `--write` stores the figures in docs/rllib_benchmark.json and rewrites the
marked section of docs/distributed.md; the rest of the file is left as it is.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys

from benchmarks import ROOT, add_publish_flags, child_environment, publish

JSON = ROOT / "docs" / "rllib_benchmark.json"
PAGE = ROOT / "docs" / "distributed.md"
BEGIN, END = "<!-- rllib-appo -->", "<!-- /rllib-appo -->"
PEER_REQUIREMENTS = ("torch==2.13.0", "ray[rllib]==2.60.0")
DEFAULT_VENV = pathlib.Path.home() / ".cache" / "batchrl" / "rllib-2.60"
CONFIG = "cartpole_impala"
THRESHOLD = 500.0  # batchrl's eval return (CartPole-v1's most)
PEER_THRESHOLD = 450.0  # RLlib's tuned example stops at this training return


def peer_python(venv):
    """The Python of the peer's virtualenv `venv`, made and filled first if it is not."""
    python = pathlib.Path(venv) / "bin" / "python"
    stamp = pathlib.Path(venv) / ".batchrl-requirements"
    if not python.exists() or not stamp.exists() or stamp.read_text() != " ".join(
            PEER_REQUIREMENTS):
        print(f"Making RLlib's environment in {venv} ({', '.join(PEER_REQUIREMENTS)}): "
              f"a few minutes, once.", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                        *PEER_REQUIREMENTS], check=True)
        stamp.write_text(" ".join(PEER_REQUIREMENTS))
    return python


def measure_peer(python, seconds, env_runners, seed):
    """Runs `benchmarks.rllib_peer` and returns its figures: dict of `built` (seconds to a
    built algorithm), `iterations` (its JSON lines), `steps_per_second`, `final_return`,
    `best_return` and `seconds_to_threshold` (None when not reached)."""
    command = [str(python), "-m", "benchmarks.rllib_peer", f"--seconds={seconds}",
               f"--env-runners={env_runners}", f"--seed={seed}"]
    print("$", " ".join(command), flush=True)
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          env=child_environment(PYTHONUNBUFFERED="1")) as process:
        for line in process.stdout:
            if line.startswith("{"):
                lines.append(json.loads(line))
                print("  rllib:", line.strip(), flush=True)
    if process.returncode:
        raise RuntimeError(f"RLlib's run failed (exit {process.returncode})")
    built, iterations = lines[0]["built"], lines[1:]
    last = iterations[-1]
    returns = [item["return"] for item in iterations if item["return"] is not None]
    reached = [item["seconds"] for item in iterations
               if item["return"] is not None and item["return"] >= PEER_THRESHOLD]
    return {"built": built, "iterations": iterations,
            "steps_per_second": last["env_steps"] / last["seconds"],
            "final_return": returns[-1] if returns else None,
            "best_return": max(returns) if returns else None,
            "seconds_to_threshold": reached[0] if reached else None}


def measure_batchrl(logdir, seeds):
    """Trains `cartpole_impala` for each seed (anew: an earlier run in its directory is
    moved aside) and returns one `batchrl.scripts.run_summary.summarize` row per seed."""
    from batchrl.scripts import benchmark, plot, run_summary

    rows = []
    for seed in seeds:
        path = run_summary.run_dir(logdir, CONFIG, seed)
        if path.exists():
            path.rename(path.with_name(path.name + f".{int(path.stat().st_mtime)}"))
        if benchmark.train_run(CONFIG, seed, path, []):
            raise RuntimeError(f"{CONFIG} seed {seed} failed: see {path}/train.log")
        row = run_summary.summarize(plot.read_run(path), THRESHOLD)
        rows.append({key: row[key] for key in (
            "seed", "final_step", "final_return", "best_return", "steps_to_threshold",
            "seconds_to_threshold", "steps_per_second")})
    return rows


def measure(args):
    python = peer_python(args.peer_venv)
    figures = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "command": " ".join(sys.argv), "cpu_count": os.cpu_count(),
               "load_average": [os.getloadavg()[0]], "env_runners": args.env_runners,
               "rllib": measure_peer(python, args.seconds, args.env_runners, args.seeds[0]),
               "batchrl": measure_batchrl(args.logdir, args.seeds)}
    figures["load_average"].append(os.getloadavg()[0])
    return figures


def _number(value, digits=0):
    return "—" if value is None else f"{value:,.{digits}f}"


def section(figures):
    """The `<!-- rllib-appo -->` section of docs/distributed.md."""
    peer, rows = figures["rllib"], figures["batchrl"]
    speed = statistics.median(row["steps_per_second"] for row in rows)
    reached = [row["seconds_to_threshold"] for row in rows]
    median_seconds = statistics.median(
        float("inf") if value is None else value for value in reached)
    lines = [
        BEGIN,
        f"Written by `python -m benchmarks.rllib_appo` on {figures['date']}, on this "
        f"{figures['cpu_count']}-core machine (load average "
        f"{figures['load_average'][0]:.1f} → {figures['load_average'][-1]:.1f}), one after "
        f"the other in that command: RLlib's APPO (Ray 2.60, torch, its tuned CartPole-v1 "
        f"settings, {figures['env_runners']} env runners, a learner actor) for "
        f"{peer['iterations'][-1]['seconds']:.0f} s of training, and `cartpole_impala` "
        f"(one Ray actor of 16 environments and the learner) for each seed. RLlib took "
        f"{peer['built']:.1f} s to build its algorithm before training.", "",
        "| | env steps/s (train, updates included) | return | training s to the "
        "threshold |",
        "|---|---:|---|---:|",
        f"| RLlib APPO | {_number(peer['steps_per_second'])} (sampled) | training return "
        f"{_number(peer['final_return'], 1)} at the end, best {_number(peer['best_return'], 1)} "
        f"| {_number(peer['seconds_to_threshold'], 1)} (training return ≥ "
        f"{PEER_THRESHOLD:.0f}) |"]
    for row in rows:
        lines.append(
            f"| batchrl `{CONFIG}`, seed {row['seed']} | {_number(row['steps_per_second'])} "
            f"| eval {_number(row['final_return'], 1)} at {row['final_step']:,} steps, best "
            f"{_number(row['best_return'], 1)} | {_number(row['seconds_to_threshold'], 1)} "
            f"(eval {THRESHOLD:.0f}) |")
    lines += [
        "",
        f"batchrl's median train steps/s is **{speed / peer['steps_per_second']:.1f}×** "
        f"RLlib's sampled steps/s; its median training seconds to eval {THRESHOLD:.0f}: "
        f"**{_number(None if median_seconds == float('inf') else median_seconds, 1)}** "
        f"(issue 44's aim: 10× and 30 s).", END]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rllib_appo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="RLlib's training seconds (default 300)")
    parser.add_argument("--env-runners", type=int, default=2, help="RLlib's env runners")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="batchrl's seeds (RLlib runs the first)")
    parser.add_argument("--logdir", type=pathlib.Path, default=ROOT / "runs" / "rllib_appo",
                        help="where batchrl's runs go, as LOGDIR/cartpole_impala/seed-N")
    parser.add_argument("--peer-venv", type=pathlib.Path, default=DEFAULT_VENV,
                        help=f"RLlib's virtualenv, made when missing (default {DEFAULT_VENV})")
    add_publish_flags(parser, JSON, f"the section of docs/{PAGE.name}")
    args = parser.parse_args(argv)
    publish(args, JSON, measure, lambda figures: [(PAGE, section(figures), BEGIN, END)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

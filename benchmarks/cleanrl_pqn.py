"""CleanRL's PyTorch PQN (`cleanrl/pqn.py`) on CartPole-v1, timed on CPU: a peer for
batchrl's PQN. Runs an unmodified copy of `pqn.py` with the Python of a separate
environment, in a temporary directory, then reads the TensorBoard events it wrote. Imports
nothing of batchrl; needs only the standard library and tensorboard's event reader.

    .venv/bin/python -m benchmarks.cleanrl_pqn --python /work/side/cleanrl-venv/bin/python \
        --script /work/side/cleanrl/pqn.py --total-timesteps 500000 --seed 1

`pqn.py` is in no PyPI release of cleanrl (the newest, 0.4.8, predates it): it is the file
`cleanrl/pqn.py` of github.com/vwxyzjn/cleanrl (master, last changed by commit 1ed8062,
Feb 2025), copied by hand to --script. The side environment (CPU-only torch; gymnasium
0.29.1, the version CleanRL pins, because with gymnasium 1.x the script runs but logs no
episodic returns: it reads the 0.29 `infos["final_info"]` list, which 1.x no longer
gives, and 1.x's next-step autoreset changes the transitions it learns from):

    python3.11 -m venv /work/side/cleanrl-venv
    /work/side/cleanrl-venv/bin/pip install "torch==2.13.0+cpu"   # or: --index-url
    #   https://download.pytorch.org/whl/cpu torch, where that index is reachable
    /work/side/cleanrl-venv/bin/pip install gymnasium==0.29.1 numpy tyro tensorboard

(measured with torch 2.13.0+cpu, gymnasium 0.29.1, numpy 2.4.6, tyro 1.0.17,
tensorboard 2.21.0 on Python 3.11.7).

`pqn.py` runs with its own CartPole defaults (4 envs x 128 steps per iteration, 4 epochs
of 4 minibatches, RAdam) and `--no-cuda --no-track --no-capture-video`; torch's thread
count is left at its default. It runs `total_timesteps // 512` whole iterations, so a few
steps fewer than asked for (499,712 of 500,000). Run it on an otherwise idle machine: its
many tiny torch ops on 2 intra-op threads slow down far more than in proportion when other
processes share the 2 cores (about 16 times, at a load average of 5 to 7). CleanRL's own
benchmark (`benchmark/pqn.sh`) runs it with OMP_NUM_THREADS=1; to do the same, set it in
this program's environment, which the subprocess inherits.

Prints one JSON line:
- `seconds`: wall-clock seconds of the whole subprocess (Python start, imports, training).
- `sps_median`, `sps_last`: median and last of the `charts/SPS` values `pqn.py` logs after
  each iteration; each is env steps so far divided by seconds since training started
  (cumulative, not per iteration), so `sps_last` is the whole run's training rate.
- `steps`: --total-timesteps; `steps_run`: the global step of the last SPS record.
- `final_return_mean_last_20_episodes`: mean of the last 20 `charts/episodic_return`
  values (training episodes under the epsilon-greedy policy, not a separate evaluation).
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types


def _scalars(run_dir):
    """{tag: [(step, value), ...]} of every scalar in the run's event files, in order."""
    # TensorBoard's own stub of TensorFlow's file API is enough to read local event files;
    # a module `tensorboard.compat.notf` tells it to use that rather than import TensorFlow
    # (installed beside it in batchrl's environment: seconds, memory and log lines).
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cleanrl_pqn",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True,
                        help="the Python of the side environment that has torch, gymnasium")
    parser.add_argument("--script", required=True, help="path of CleanRL's pqn.py")
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    script = os.path.abspath(args.script)
    command = [args.python, script, "--env-id", "CartPole-v1", "--no-cuda", "--no-track",
               "--no-capture-video", "--total-timesteps", str(args.total_timesteps),
               "--seed", str(args.seed)]
    with tempfile.TemporaryDirectory(prefix="cleanrl_pqn_") as work:
        out_path = os.path.join(work, "stdout.txt")
        err_path = os.path.join(work, "stderr.txt")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            start = time.perf_counter()
            returncode = subprocess.run(command, cwd=work, stdout=out, stderr=err,
                                        stdin=subprocess.DEVNULL, check=False).returncode
            seconds = time.perf_counter() - start
        if returncode != 0:
            with open(err_path, encoding="utf-8", errors="replace") as err:
                sys.stderr.write(err.read()[-4000:])
            sys.exit(f"pqn.py exited with {returncode}")
        run_dirs = sorted(glob.glob(os.path.join(work, "runs", "*")))
        if len(run_dirs) != 1:
            sys.exit(f"expected one TensorBoard run under runs/, found {len(run_dirs)}")
        scalars = _scalars(run_dirs[0])
    sps = scalars.get("charts/SPS", [])
    returns = [value for _, value in scalars.get("charts/episodic_return", [])]
    last = returns[-20:]
    print(json.dumps({
        "seconds": round(seconds, 2),
        "sps_median": statistics.median(value for _, value in sps) if sps else None,
        "sps_last": sps[-1][1] if sps else None,
        "steps": args.total_timesteps,
        "steps_run": sps[-1][0] if sps else None,
        "final_return_mean_last_20_episodes": round(statistics.fmean(last), 2) if last else None,
    }))


if __name__ == "__main__":
    main()

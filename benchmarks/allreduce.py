"""What M learners sharing the update would cost and give (issue 61, "learners that share
the update"): one all-reduce of the gradients per update, measured between two learner
processes on this machine with TensorFlow's own collective all-reduce (the engine of
`tf.distribute.MultiWorkerMirroredStrategy`: gRPC between the processes, `TF_CONFIG` set
per process), and the scaling model of docs/scaling.md redone with it.

    .venv/bin/python -m benchmarks.allreduce --write       # measure; write the docs
    .venv/bin/python -m benchmarks.allreduce --report-only --write   # from the JSON

Measured:
1. `allreduce`: two worker processes (this module with `--worker`), each a
   MultiWorkerMirroredStrategy worker of a two-worker cluster on localhost, time one
   all-reduce (mean, `collective_ops.all_reduce_v2` on the strategy's collective executor)
   of float32 vectors of `SIZES` elements: the median seconds of `--repeats` after two
   that warm up. A least-squares line t(B) = a + b B over the bytes B gives the latency
   `a` and the seconds per byte `b` of a two-worker all-reduce.
2. For each config of `CONFIGS`, in this process: the trainable parameters its update
   steps (what an all-reduce carries), an actor's steps/s (one actor of `envs_per_actor`
   environments recording in this process) and the learner's seconds per update on what
   the actor recorded (`learn`, the median after two that trace; for Ape-X, the
   seconds of a recording's updates over their number).

The model: N nodes like this one hosting 2 actors each, M learners on nodes of their own,
each taking 1/M of the fragments (Ape-X: of the transitions, into a replay shard of its
own) and all of them averaging their gradients every update, in lock-step. A ring
all-reduce among M workers sends 2 (M - 1) / M of the bytes and waits 2 (M - 1) latencies;
from the two-worker line, t(M, B) = (M - 1) a + 2 (M - 1) / M b B (t(2, B) = a + b B). The
learners then take at most M S / (u + t(M, B)) steps/s, S the steps per update (a
fragment's steps; Ape-X: 1 / `updates_per_step`) and u one update's seconds; the actors
make 2 N p (p one actor's steps/s); steps/s = the least of the two. Left out: the
fragments' transfer (docs/scaling.md's model above has it), other machines than this one
(the latency and bandwidth are this machine's loopback: between nodes, a network's), and
the evaluations.

`--write` keeps the figures in docs/allreduce_benchmark.json and rewrites the marked section
of docs/scaling.md.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from batchrl.distributed.learners import free_ports
from benchmarks import ROOT, add_publish_flags, child_environment, publish

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

JSON = ROOT / "docs" / "allreduce_benchmark.json"
SCALING = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- allreduce -->", "<!-- /allreduce -->"
SIZES = (1_000, 10_000, 100_000, 1_000_000, 4_000_000)  # float32 elements.
CONFIGS = ("cheetah_appo", "pong_appo", "minatar_breakout_apex")
LEARNERS = (1, 2, 4, 8)
ACTORS_PER_NODE = 2


def worker(index, ports, sizes, repeats):
    """One worker of the two-worker cluster: times the all-reduce of each size; worker 0
    prints `{elements: seconds}` as a JSON line (the mean checked against the two workers'
    values)."""
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{port}" for port in ports]},
        "task": {"type": "worker", "index": index}})
    import tensorflow as tf
    from tensorflow.python.ops import collective_ops

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    device = strategy.extended.worker_devices[0]
    seconds = {}
    for key, size in enumerate(sizes, 1):
        values = tf.fill([size], float(index + 1))

        @tf.function
        def reduce(values, key=key):
            with tf.device(device):
                return collective_ops.all_reduce_v2(
                    values, group_size=len(ports), group_key=1, instance_key=key,
                    merge_op="Add", final_op="Div")

        for _ in range(2):
            mean = reduce(values).numpy()
        if abs(float(mean[0]) - (len(ports) + 1) / 2) > 1e-6:
            raise RuntimeError(f"the all-reduce gave {mean[0]}")
        timed = []
        for _ in range(repeats):
            start = time.perf_counter()
            reduce(values).numpy()
            timed.append(time.perf_counter() - start)
        seconds[size] = statistics.median(timed)
    if index == 0:
        print(json.dumps(seconds), flush=True)


def measure_allreduce(sizes, repeats):
    """`{bytes: seconds}` of a two-worker all-reduce, from two worker processes."""
    ports = ",".join(map(str, free_ports(2)))
    command = [sys.executable, "-m", "benchmarks.allreduce", "--ports", ports,
               "--sizes", *map(str, sizes), "--repeats", str(repeats), "--worker"]
    environment = child_environment()
    workers = [subprocess.Popen(command + [str(index)], env=environment, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
               for index in range(2)]
    outputs = [process.communicate(timeout=600)[0] for process in workers]
    if any(process.returncode for process in workers):
        raise RuntimeError(f"an all-reduce worker failed: {[p.returncode for p in workers]}")
    line = [text for text in outputs[0].splitlines() if text.startswith("{")][-1]
    return {int(size) * 4: seconds for size, seconds in json.loads(line).items()}


def fit(points):
    """`(a, b)` of the least-squares line t = a + b B through `{bytes: seconds}`."""
    xs, ys = list(map(float, points)), list(points.values())
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
             / sum((x - mean_x) ** 2 for x in xs))
    return mean_y - slope * mean_x, slope


def allreduce_seconds(learners, nbytes, a, b):
    """A ring all-reduce's seconds among `learners` workers, from the two-worker line."""
    if learners == 1:
        return 0.0
    return (learners - 1) * a + 2 * (learners - 1) / learners * b * nbytes


def _trainable(algo):
    """The trainable variables an update steps: on-policy, the policy's and the value
    network's; off-policy, the policy's and its critic's (not the targets)."""
    if hasattr(algo, "_joint_variables"):
        return algo._joint_variables()
    variables = list(algo.actor.policy.trainable_variables)
    critic = getattr(algo.actor.critic, "critic", None)
    return variables + (list(critic.trainable_variables) if critic is not None else [])


def measure_config(name, recordings):
    """`{parameters, steps_per_update, update, actor}` of config `name`: the trainable
    parameters of its update, the environment steps one update stands for, one update's
    seconds, one actor's steps/s (all in this process)."""
    import numpy as np

    from batchrl import build, configs, environments
    from batchrl.distributed import actor as actor_lib
    from batchrl.distributed import fragment as fragment_lib

    config = configs.load(name, {"actors": 1, "num_agents": 1})
    actor = actor_lib.actor_class(config.algorithm)(config, 0)
    actor.build()
    for _ in range(2):
        recording = actor.collect()["fragment"]
    seconds = []
    for _ in range(recordings):
        start = time.perf_counter()
        recording = actor.collect()["fragment"]
        seconds.append(time.perf_counter() - start)
    actor.close()
    steps = int(np.sum(recording["length"]))
    learner_config = configs.Config(config, actors=0, env_backend="local", num_agents=1)
    if actor_lib.sends(config.algorithm) == "transitions":
        learner_config = configs.Config(learner_config, learning_starts=0)
    built = build.build(learner_config, environments.create_batch(learner_config))
    learned = recording if "td_error" in recording else fragment_lib.expand(recording)
    for _ in range(2):
        built.algo.learn(learned)
    updates, timed = 0, []
    for _ in range(recordings):
        start = time.perf_counter()
        made = built.algo.learn(learned)["updates"]
        float(built.step.numpy())
        timed.append((time.perf_counter() - start) / max(made, 1))
        updates += made
    parameters = sum(int(np.prod(variable.shape)) for variable in _trainable(built.algo))
    built.batch_env.close()
    per_update = (1.0 / float(config.updates_per_step)
                  if actor_lib.sends(config.algorithm) == "transitions" else steps)
    return {"parameters": parameters, "steps_per_update": per_update,
            "update": statistics.median(timed), "actor": steps / statistics.median(seconds)}


def measure(args):
    figures = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "command": " ".join(sys.argv), "cpu_count": os.cpu_count(),
               "load_average": [os.getloadavg()[0]],
               "allreduce": measure_allreduce(SIZES, args.repeats), "configs": {}}
    print(f"all-reduce: {json.dumps(figures['allreduce'])}", flush=True)
    for name in args.configs:
        figures["configs"][name] = measure_config(name, args.recordings)
        print(f"{name}: {json.dumps(figures['configs'][name])}", flush=True)
    figures["load_average"].append(os.getloadavg()[0])
    return figures


def model(entry, learners, nodes, a, b):
    """`(steps/s, bound)` with `learners` learners and `nodes` nodes of actors."""
    seconds = entry["update"] + allreduce_seconds(learners, 4 * entry["parameters"], a, b)
    bounds = {"learners": learners * entry["steps_per_update"] / seconds,
              "actors": ACTORS_PER_NODE * nodes * entry["actor"]}
    bound = min(bounds, key=bounds.get)
    return bounds[bound], bound


def section(figures):
    """docs/scaling.md's marked section of `figures`."""
    points = {int(key): value for key, value in figures["allreduce"].items()}
    a, b = fit(points)
    lines = [BEGIN, f"Written by `python -m benchmarks.allreduce` on {figures['date']} from "
             f"costs measured on this {figures['cpu_count']}-core machine (load average "
             f"{figures['load_average'][0]:.1f} → {figures['load_average'][-1]:.1f}).", "",
             "One all-reduce (mean) of float32 vectors between two learner processes here "
             "(TensorFlow's collective all-reduce, MultiWorkerMirroredStrategy's engine, "
             "gRPC over loopback):", "",
             "| bytes | seconds | line a + b B |", "|---:|---:|---:|"]
    for nbytes, seconds in sorted(points.items()):
        lines.append(f"| {nbytes:,} | {seconds * 1e3:.2f} ms | "
                     f"{(a + b * nbytes) * 1e3:.2f} ms |")
    lines += ["", f"Latency a = {a * 1e3:.2f} ms, bandwidth 1 / b = {1 / b / 1e9:.2f} GB/s.",
              "", "| config | parameters | bytes per all-reduce | update (one learner) | "
              "steps per update | one actor (steps/s) | " + " | ".join(
                  f"M = {m}: learners' bound (steps/s), nodes to reach it" for m in LEARNERS)
              + " |", "|---|---:|---:|---:|---:|---:|" + "---:|" * len(LEARNERS)]
    for name, entry in figures["configs"].items():
        cells = []
        for learners in LEARNERS:
            bound, _ = model(entry, learners, 10 ** 9, a, b)
            nodes = bound / (ACTORS_PER_NODE * entry["actor"])
            cells.append(f"{bound:,.0f}, {nodes:.1f}")
        lines.append(
            f"| `{name}` | {entry['parameters']:,} | {4 * entry['parameters']:,} | "
            f"{entry['update'] * 1e3:.1f} ms | {entry['steps_per_update']:,.2f} | "
            f"{entry['actor']:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", "Nodes to reach it: the learners' bound over what one node's "
              f"{ACTORS_PER_NODE} actors make; past it, more nodes add nothing. An update's "
              "seconds grow with M by the all-reduce's, t(M, B) = (M - 1) a + 2 (M - 1) / M "
              "b B: the latency term grows with M, the bytes' term stays under 2 b B.", END]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.allreduce",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS),
                        help="configs of the model (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=30,
                        help="timed all-reduces per size")
    parser.add_argument("--recordings", type=int, default=5,
                        help="timed recordings and updates per config")
    add_publish_flags(parser, JSON, "the section of docs/scaling.md")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, [int(port) for port in args.ports.split(",")], args.sizes,
               args.repeats)
        return 0
    publish(args, JSON, measure,
            lambda figures: [(SCALING, section(figures), BEGIN, END)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

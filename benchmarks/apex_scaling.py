"""Ape-X's costs measured on this machine, and the actor-learner's scaling model
(`benchmarks.actor_scaling`) extended to it, with the replay ratio held.

    .venv/bin/python -m benchmarks.apex_scaling --write     # measure; write the docs
    .venv/bin/python -m benchmarks.apex_scaling --report-only --write  # from the JSON

For each config of `ENVS` (`minatar_breakout_apex`: DQN on a convolution;
`cheetah_sac_apex`: SAC on EnvPool's HalfCheetah-v5), with one actor of `envs_per_actor`
environments and calls of `rollout_length` steps each:

1. `inprocess` and `ray`: a `TransitionActor`'s seconds per call in this process, and on
   Ray with two calls in flight (plus Ray's cost per call, this process's CPU seconds to
   receive one, and its bytes), as `benchmarks.actor_scaling` measures fragments.
2. `learner`: the learner's seconds per call (`OffPolicyAlgorithm.learn` on a
   recorded call, its memory holding `learning_starts` transitions): `insert`, storing
   the transitions alone (`updates_per_step: 0`), and `learn`, storing them and making the
   `updates_per_step × steps` updates they are owed; the medians after two that trace.

The model (docs/scaling.md, `<!-- apex-scaling -->`): N nodes like this one, each hosting
2 actors of one core, the learner on a node of its own. The actors produce `2 N p`
steps/s; the learner, holding the replay ratio, consumes at most `L = steps per call /
(learn + receive)` steps/s, `updates_per_step × L` updates/s; the network at most
`bandwidth / bytes per step`; steps/s = min(2 N p, L, network), and updates/s =
`updates_per_step` × steps/s. Left out as in `benchmarks.actor_scaling`, and the replay
memory's size (its sampling cost grows as log(capacity)).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np

from benchmarks import ROOT, add_publish_flags, child_environment, publish
from benchmarks.actor_scaling import (
    ACTORS_PER_NODE,
    BANDWIDTH,
    NODES,
    _config,
    _number,
    measure_inprocess,
    measure_ray,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

JSON = ROOT / "docs" / "apex_benchmark.json"
SCALING = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- apex-scaling -->", "<!-- /apex-scaling -->"
# name -> (config, overrides of it)
ENVS = {"MinAtar Breakout (DQN)": ("minatar_breakout_apex", {}),
        "HalfCheetah-v5 (SAC)": ("cheetah_sac_apex", {})}


def measure_learner(config, recording, calls):
    """`{"insert": s, "learn": s, "batch_size": int}`: seconds per call of the learner on
    `recording` (a `TransitionActor` call's), storing only and storing then updating,
    medians of `calls` after two that trace (the memory first filled to
    `learning_starts`), and the updates' batch size."""
    from batchrl import build as build_lib
    from batchrl import configs, environments

    figures = {}
    for name, ratio in (("insert", 0.0), ("learn", config.updates_per_step)):
        learner = configs.Config(config, actors=0, num_agents=1, updates_per_step=ratio)
        built = build_lib.build(learner, environments.create_batch(learner))
        algo = built.algo
        # Filled without updates: the same transitions, counted as no steps.
        filling = dict(recording, length=np.zeros_like(recording["length"]))
        while int(algo.memory.size.numpy()) < config.learning_starts:
            algo.learn(filling)
        seconds = []
        for index in range(calls + 2):
            start = time.perf_counter()
            algo.learn(recording)
            if index >= 2:
                seconds.append(time.perf_counter() - start)
        figures[name] = statistics.median(seconds)
        figures["batch_size"] = algo.batch_size
        built.batch_env.close()
    return figures


def measure(args):
    from batchrl.environments.ray import connection as ray_connection

    ray_connection.connect(None)
    figures = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "command": " ".join(sys.argv), "cpu_count": os.cpu_count(),
               "load_average": [os.getloadavg()[0]], "envs": {}}
    for name, (config_name, overrides) in ENVS.items():
        config = _config(config_name, overrides)
        inprocess, recording = measure_inprocess(config, args.calls)
        entry = {"config": config_name, "envs_per_actor": config.envs_per_actor,
                 "rollout_length": config.rollout_length,
                 "updates_per_step": config.updates_per_step, "inprocess": inprocess,
                 "ray": measure_ray(config, args.calls),
                 "learner": measure_learner(config, recording, args.calls)}
        figures["envs"][name] = entry
        print(f"{name}: {json.dumps(entry)}", flush=True)
    figures["load_average"].append(os.getloadavg()[0])
    ray_connection.disconnect()
    return figures


def costs(entry, ratio=None):
    """The model's figures of one config's `entry` at `ratio` updates per step (None: the
    config's): `steps` per call, `actor` (one actor's steps/s on Ray, two in flight),
    `inprocess`, `ray_cost` (seconds per call), `bytes_per_step`, `insert` (the
    learner's seconds to store one step's transitions), `learner` (its bound in steps/s
    at the ratio: storing, the ratio's share of the measured updates, and receiving) and
    `updates` (its updates/s then)."""
    steps = entry["envs_per_actor"] * entry["rollout_length"]
    ray, learner = entry["ray"], entry["learner"]
    measured = entry["updates_per_step"]
    ratio = measured if ratio is None else ratio
    updating = (learner["learn"] - learner["insert"]) * ratio / measured
    bound = steps / (learner["insert"] + updating + ray["receive"])
    return {"steps": steps, "actor": steps / ray["pipelined"],
            "inprocess": steps / entry["inprocess"],
            "ray_cost": max(0.0, ray["call"] - ray["recording"]),
            "bytes_per_step": ray["bytes"] / steps, "insert": learner["insert"] / steps,
            "learner": bound, "updates": ratio * bound}


def model(entry, nodes, ratio=None, actors_per_node=ACTORS_PER_NODE, bandwidth=BANDWIDTH):
    """`(steps/s, bound)` on `nodes` nodes at `ratio` updates per step (None: the
    config's): the least of the actors' production, the learner's bound at the ratio and
    the network's, and which it is."""
    k = costs(entry, ratio)
    bounds = {"actors": actors_per_node * nodes * k["actor"], "learner": k["learner"],
              "network": bandwidth / k["bytes_per_step"]}
    bound = min(bounds, key=bounds.get)
    return bounds[bound], bound


def section(figures):
    """The `<!-- apex-scaling -->` section of docs/scaling.md."""
    lines = [BEGIN, f"Written by `python -m benchmarks.apex_scaling` on {figures['date']} "
             f"from costs measured on this {figures['cpu_count']}-core machine (load average "
             f"{figures['load_average'][0]:.1f} → {figures['load_average'][-1]:.1f}).", ""]
    lines += ["| config | steps per call | one actor in-process (steps/s) | on Ray, two in "
              "flight | Ray per call | receive (learner CPU) | bytes per step | insert per "
              "step | replay ratio | learner (steps/s) | its updates/s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for entry in figures["envs"].values():
        k = costs(entry)
        lines.append(
            f"| `{entry['config']}` | {k['steps']:,} | {_number(k['inprocess'])} "
            f"| {_number(k['actor'])} | {k['ray_cost'] * 1e3:.1f} ms "
            f"| {entry['ray']['receive'] * 1e3:.2f} ms | {k['bytes_per_step']:.0f} "
            f"| {k['insert'] * 1e6:.1f} µs | {entry['updates_per_step']:g} "
            f"| {_number(k['learner'])} | {_number(k['updates'])} |")
    lines.append("")
    for entry in figures["envs"].values():
        k = costs(entry)
        measured = entry["updates_per_step"]
        ratios = (measured, measured / 4, measured / 16)
        lines += [f"**`{entry['config']}`**, {ACTORS_PER_NODE} actors of "
                  f"{entry['envs_per_actor']} environments per node, the learner (batches "
                  f"of {entry['learner']['batch_size']}) on a node of its own; steps/s and "
                  f"the bound at the config's `updates_per_step`, {measured:g}, and at a "
                  f"quarter and a sixteenth of it:", "",
                  "| nodes | environments | " + " | ".join(
                      f"{ratio:g}: steps/s | updates/s | bound" for ratio in ratios) + " |",
                  "|---:|---:|" + "---:|---:|---|" * len(ratios)]
        for nodes in NODES:
            cells = []
            for ratio in ratios:
                rate, bound = model(entry, nodes, ratio)
                cells.append(f"{_number(rate)} | {_number(rate * ratio)} | {bound}")
            environments = nodes * ACTORS_PER_NODE * entry["envs_per_actor"]
            lines.append(f"| {nodes} | {environments:,} | " + " | ".join(cells) + " |")
        reach = "; ".join(
            f"at {ratio:g}, {_number(costs(entry, ratio)['learner'])} steps/s, reached at "
            f"{costs(entry, ratio)['learner'] / (ACTORS_PER_NODE * k['actor']):.2f} nodes"
            for ratio in ratios)
        lines += ["", f"The learner's bound: {reach}. Past it more actors add nothing: the "
                      f"learner holds the ratio and the bounded calls in flight make the "
                      f"actors wait. Only a lower replay ratio (Ape-X's many actors and "
                      f"about 1.3 replays per transition) or a faster update moves it.", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.apex_scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10,
                        help="timed calls of each measurement")
    add_publish_flags(parser, JSON, "the section of docs/scaling.md")
    args = parser.parse_args(argv)
    # The local Ray that `measure` starts hands its environment to the actors.
    os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
    publish(args, JSON, measure,
            lambda figures: [(SCALING, section(figures), BEGIN, END)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

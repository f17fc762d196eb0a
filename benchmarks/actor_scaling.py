"""The actor-learner's costs measured on this machine (docs/distributed.md), and a model of
its steps/s on N nodes built from them.

    .venv/bin/python -m benchmarks.actor_scaling --write     # measure; write the docs
    .venv/bin/python -m benchmarks.actor_scaling --report-only --write  # from the JSON

Everything runs in this process and on a local Ray that it starts (the repository root on
its PYTHONPATH, so that an actor can build `benchmarks.slow_envs.SlowPendulum`). For each
environment of `ENVS` (EnvPool's HalfCheetah-v5 as `cheetah_appo` has it, and
`SlowPendulum`, Pendulum-v1 that keeps a core busy 1 ms a step, in `pendulum_appo`'s
settings), with one actor of `envs_per_actor` environments recording fragments of
`rollout_length` steps:

1. `inprocess`: a `FragmentActor` built in this process records fragments one after the
   other: seconds per fragment (the median after two that warm up).
2. `ray`: the same actor as a Ray actor (one CPU), called as `ActorPool` calls it, two
   fragments in flight: wall seconds per fragment over the run, against the in-process
   ones (the issue's "an actor alone"); then one call at a time: Ray's cost per fragment
   (the wall time of a call minus the recording time the actor measured) and this
   process's CPU time to receive a fragment (`ray.get`); the fragment's bytes.
3. `learner`: one update of `impala` and of `appo` (the config's settings) on a fragment,
   as `ActorLearnerLoop` makes it (`IMPALA.learn` on the expanded fragment): seconds per
   update, the median after two (tracing) calls.

The model (docs/scaling.md, `<!-- actor-scaling -->`): N nodes like this one (2 cores),
each hosting 2 actors of one core, the learner on a node of its own. The actors produce
`2 N p` steps/s (p: one actor's steps/s with two fragments in flight, as measured); the
learner consumes at most `L = steps per fragment / (update + receive)`, and the network
at most `bandwidth / bytes per step` (an assumed 10 Gbit/s link into the learner), so
that steps/s = min(2 N p, L, network). Left out: other machines assumed as fast; the
learner's evaluations; Ray's scheduling of many actors assumed as cheap as of one.

`--write` stores the figures in docs/actor_benchmark.json and rewrites the marked section
of docs/scaling.md; the rest of the file is left as it is.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

from benchmarks import ROOT, add_publish_flags, child_environment, publish, replace_marked

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

JSON = ROOT / "docs" / "actor_benchmark.json"
SCALING = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- actor-scaling -->", "<!-- /actor-scaling -->"
# name -> (config, overrides of it)
ENVS = {"HalfCheetah-v5": ("cheetah_appo", {}),
        "SlowPendulum (1 ms)": ("pendulum_appo", {
            "env": "benchmarks.slow_envs:SlowPendulum", "env_kwargs": {"step_us": 1000.0},
            "max_length": 200})}
KINDS = ("impala", "appo")
NODES = (1, 2, 4, 8, 16, 32, 64)
BANDWIDTH = 10e9 / 8  # Bytes/s into the learner: an assumed 10 Gbit/s link.
ACTORS_PER_NODE = 2


def _config(name, overrides, **more):
    from batchrl import configs

    return configs.load(name, {**overrides, **more})


def _quiet_tensorflow():
    """An actor's setup: TensorFlow's logs off before it is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _actor_class(config):
    """The actor class of `config`'s algorithm: `TransitionActor` (Ape-X) or
    `FragmentActor`."""
    from batchrl.distributed.actor import actor_class

    return actor_class(config.algorithm)


def measure_inprocess(config, fragments):
    """Seconds per fragment of an actor (`FragmentActor`, or `TransitionActor` for an
    off-policy algorithm) built in this process (median), and one fragment it recorded
    (for the learner)."""
    actor = _actor_class(config)(config, 0)
    actor.build()
    for _ in range(2):
        result = actor.collect(0, None)
    seconds = []
    for _ in range(fragments):
        start = time.perf_counter()
        result = actor.collect(0, None)
        seconds.append(time.perf_counter() - start)
    # Closed before the Ray actor runs: EnvPool's idle threads in this process took CPU
    # from it (0.56x of the in-process rate with them, 0.8-0.9x without).
    actor.close()
    return statistics.median(seconds), result["fragment"]


def measure_ray(config, fragments):
    """The same actor on Ray: dict of `pipelined` (wall seconds per fragment with two in
    flight), `call` (wall seconds of one call at a time, median), `recording` (the actor's
    own recording seconds of those calls, median), `receive` (this process's CPU seconds
    in `ray.get`, median) and `bytes` (of a fragment's arrays)."""
    import ray

    actor = ray.remote(num_cpus=1)(_actor_class(config)).remote(config, 0, _quiet_tensorflow)
    ray.get(actor.build.remote())
    for _ in range(2):
        ray.get(actor.collect.remote(0, None))
    start = time.perf_counter()
    pending = [actor.collect.remote(0, None) for _ in range(2)]
    for index in range(fragments):
        ray.get(pending.pop(0))
        if index + 2 < fragments:
            pending.append(actor.collect.remote(0, None))
    pipelined = (time.perf_counter() - start) / fragments
    calls, recordings, receives = [], [], []
    for _ in range(fragments):
        start = time.perf_counter()
        reference = actor.collect.remote(0, None)
        ray.wait([reference])
        cpu = time.process_time()
        result = ray.get(reference)
        receives.append(time.process_time() - cpu)
        calls.append(time.perf_counter() - start)
        recordings.append(result["seconds"])
    ray.kill(actor)
    size = _nbytes(result["fragment"])
    return {"pipelined": pipelined, "call": statistics.median(calls),
            "recording": statistics.median(recordings),
            "receive": statistics.median(receives), "bytes": size}


def _nbytes(arrays):
    """The bytes of a dict of arrays (nested dicts too)."""
    return sum(_nbytes(value) if isinstance(value, dict) else value.nbytes
               for value in arrays.values())


def measure_learner(config, fragment, kind, updates):
    """Seconds of one `kind` update on `fragment` (expanded as the learner does), the
    median of `updates` after two calls that trace."""
    from batchrl import build as build_lib
    from batchrl import configs, environments
    from batchrl.distributed import fragment as fragment_lib

    # The keys that only the other algorithm reads keep their defaults (`algorithm_class`).
    defaults = configs.load("default")
    others = set().union(*(algorithm.config_keys for algorithm in build_lib.ALGORITHMS.values()))
    own = build_lib.ALGORITHMS[kind].config_keys
    values = {key: defaults[key] for key in others - own}
    values.update(algorithm=kind, actors=0, env_backend="local", num_agents=1)
    learner = _with(config, **values)
    built = build_lib.build(learner, environments.create_batch(learner))
    expanded = fragment_lib.expand(fragment)
    for _ in range(2):
        built.algo.learn(expanded)
    seconds = []
    for _ in range(updates):
        start = time.perf_counter()
        result = built.algo.learn(expanded)
        float(result["loss"])
        seconds.append(time.perf_counter() - start)
    built.batch_env.close()
    return statistics.median(seconds)


def _with(config, **values):
    from batchrl import configs

    return configs.Config(config, **values)


def measure(args):
    from batchrl.environments.ray import connection as ray_connection

    ray_connection.connect(None)
    figures = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "command": " ".join(sys.argv), "cpu_count": os.cpu_count(),
               "load_average": [os.getloadavg()[0]], "envs": {}}
    for name, (config_name, overrides) in ENVS.items():
        config = _config(config_name, overrides)
        inprocess, fragment = measure_inprocess(config, args.fragments)
        entry = {"config": config_name, "envs_per_actor": config.envs_per_actor,
                 "rollout_length": config.rollout_length, "inprocess": inprocess,
                 "ray": measure_ray(config, args.fragments),
                 "learner": {kind: measure_learner(config, fragment, kind, args.updates)
                             for kind in KINDS}}
        figures["envs"][name] = entry
        print(f"{name}: {json.dumps(entry)}", flush=True)
    figures["load_average"].append(os.getloadavg()[0])
    ray_connection.disconnect()
    return figures


def costs(entry):
    """The model's figures of one environment's `entry`: `steps` per fragment, `actor` (one
    actor's steps/s on Ray, two in flight), `inprocess` (the same in this process),
    `ray_cost` (seconds per fragment), `bytes_per_step`, and `learner` (kind -> the
    learner's bound in steps/s: steps per fragment over the update and the receive)."""
    steps = entry["envs_per_actor"] * entry["rollout_length"]
    ray = entry["ray"]
    return {
        "steps": steps, "actor": steps / ray["pipelined"],
        "inprocess": steps / entry["inprocess"],
        "ray_cost": max(0.0, ray["call"] - ray["recording"]),
        "bytes_per_step": ray["bytes"] / steps,
        "learner": {kind: steps / (seconds + ray["receive"])
                    for kind, seconds in entry["learner"].items()}}


def model(entry, kind, nodes, actors_per_node=ACTORS_PER_NODE, bandwidth=BANDWIDTH):
    """`(steps/s, bound)` on `nodes` nodes with the `kind` learner: the least of the actors'
    production, the learner's bound and the network's, and which of `actors`, `learner`,
    `network` it is."""
    k = costs(entry)
    bounds = {"actors": actors_per_node * nodes * k["actor"], "learner": k["learner"][kind],
              "network": bandwidth / k["bytes_per_step"]}
    bound = min(bounds, key=bounds.get)
    return bounds[bound], bound


def learner_nodes(entry, kind, actors_per_node=ACTORS_PER_NODE):
    """The number of nodes (a float) whose actors produce what the `kind` learner can take."""
    k = costs(entry)
    return k["learner"][kind] / (actors_per_node * k["actor"])


def _number(value):
    return f"{value:,.0f}"


def section(figures):
    """The `<!-- actor-scaling -->` section of docs/scaling.md."""
    lines = [BEGIN, f"Written by `python -m benchmarks.actor_scaling` on {figures['date']} "
             f"from costs measured on this {figures['cpu_count']}-core machine (load average "
             f"{figures['load_average'][0]:.1f} → {figures['load_average'][-1]:.1f}).", ""]
    lines += ["| environment | steps per fragment | one actor in-process (steps/s) | on Ray, two "
              "in flight | ratio | Ray per fragment | receive (learner CPU) | bytes per step "
              "| learner impala (steps/s) | learner appo (steps/s) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, entry in figures["envs"].items():
        k = costs(entry)
        lines.append(
            f"| {name} | {k['steps']:,} | {_number(k['inprocess'])} | {_number(k['actor'])} "
            f"| {k['actor'] / k['inprocess']:.2f}× | {k['ray_cost'] * 1e3:.1f} ms "
            f"| {entry['ray']['receive'] * 1e3:.2f} ms | {k['bytes_per_step']:.0f} "
            f"| {_number(k['learner']['impala'])} | {_number(k['learner']['appo'])} |")
    lines.append("")
    for name, entry in figures["envs"].items():
        lines += [f"**{name}**, `{entry['config']}`'s settings, {ACTORS_PER_NODE} actors of "
                  f"{entry['envs_per_actor']} environments per node, the learner on a node "
                  f"of its own:", "",
                  "| nodes | environments | " + " | ".join(
                      f"{kind}: steps/s | per node | bound" for kind in KINDS) + " |",
                  "|---:|---:|" + "---:|---:|---|" * len(KINDS)]
        for nodes in NODES:
            cells = []
            for kind in KINDS:
                rate, bound = model(entry, kind, nodes)
                one, _ = model(entry, kind, 1)
                cells.append(f"{_number(rate)} | {rate / (nodes * one):.2f}× | {bound}")
            environments = nodes * ACTORS_PER_NODE * entry["envs_per_actor"]
            lines.append(f"| {nodes} | {environments:,} | " + " | ".join(cells) + " |")
        lines.append("")
        k = costs(entry)
        reach = "; ".join(
            f"{kind}: its bound, {_number(k['learner'][kind])} steps/s, is reached at "
            f"{learner_nodes(entry, kind):.1f} nodes, M learners sharing the update would "
            f"move it to M times that (up to the network's "
            f"{_number(BANDWIDTH / k['bytes_per_step'])} steps/s)" for kind in KINDS)
        lines += [f"Up to the learner's bound each node adds its actors' steps (1.00× per "
                  f"node); {reach}.", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(path, text):
    """Replaces the marked section of `path` with `text`, or appends it."""
    replace_marked(path, text, BEGIN, END)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.actor_scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fragments", type=int, default=10,
                        help="timed fragments of each measurement of an actor")
    parser.add_argument("--updates", type=int, default=10,
                        help="timed updates of each learner")
    add_publish_flags(parser, JSON, "the section of docs/scaling.md")
    args = parser.parse_args(argv)
    # The local Ray that `measure` starts hands its environment to the actors.
    os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
    publish(args, JSON, measure,
            lambda figures: [(SCALING, section(figures), BEGIN, END)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Ray backend's throughput against `ParallelBatchEnv`, and a model of scaling out built
from per-step costs measured on this machine.

    .venv/bin/python -m benchmarks.ray_scaling --write     # measure; write the docs
    .venv/bin/python -m benchmarks.ray_scaling --report-only --write  # from the JSON

Everything runs in this process, on a local Ray that it starts (the repository root is put
on its PYTHONPATH first, so that the actors can build `benchmarks.slow_envs.SlowPendulum`).

1. Pairs, each measured in alternating windows of `--window` seconds for `--seconds` in
   all (a slow spell of the shared machine hits both sides of a ratio alike; the ratio of
   each pair of adjacent windows is kept, and the median reported): `ray` (`RayBatchEnv`)
   against `parallel` (`ParallelBatchEnv`), both with 2 workers and 32 environments, for
   HalfCheetah-v5 and for `SlowPendulum` (1 ms of CPU a step), at two levels: `raw`
   (`step`, and `reset` of the environments whose episode ended) and `simulate` (the
   training loop's step function with `MockAlgorithm`, `--steps-per-call` steps a call).
2. Per-step costs: one environment in a plain loop (seconds per step, one core); Ray's cost
   per batch step with W = 1, 2, 4 actors of one Pendulum each: wall time, and this
   process's CPU time (the serial part, `d` per actor, by least squares); the learner's
   cost per batch step while it collects (the `cheetah` config's BatchPPO acting and
   recording, on `MockEnvironment`s of HalfCheetah's shapes whose stepping costs almost
   nothing) for B = 32, 128, 512 (`c0 + c1 B` by least squares); one `cheetah` update of
   10 episodes (`python -m benchmarks.speed update`), as `u` seconds per environment step.
3. The model (see docs/scaling.md): N nodes like this one (2 cores), each hosting 2 actors
   of 16 environments, the trainer on a node of its own; a batch step takes
   `T(N) = 16 s + (r + RTT) + (2N d + c0 + c1 B + u B)` with B = 32 N (the environments of
   the slowest actor; Ray's fixed cost and the network's round trip; the trainer's own
   time: Ray's cost per actor and the learner), and steps/s = B / T.

`--write` stores the figures in docs/ray_benchmark.json and rewrites the marked sections
`<!-- ray-backend -->` of docs/performance.md (kept by `benchmarks.throughput.report`) and
`<!-- ray-scaling -->` of docs/scaling.md; the rest of both files is left as it is.
"""

import argparse
import datetime
import functools
import itertools
import os
import statistics
import sys
import time

import numpy as np

from benchmarks import ROOT, add_publish_flags, child_environment, publish, replace_marked

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

JSON = ROOT / "docs" / "ray_benchmark.json"
PERFORMANCE = ROOT / "docs" / "performance.md"
SCALING = ROOT / "docs" / "scaling.md"
SECTIONS = {"performance": ("<!-- ray-backend -->", "<!-- /ray-backend -->"),
            "scaling": ("<!-- ray-scaling -->", "<!-- /ray-scaling -->")}
ENVS = {"HalfCheetah-v5": ("HalfCheetah-v5", {}),
        "SlowPendulum (1 ms)": ("benchmarks.slow_envs:SlowPendulum", {"step_us": 1000.0})}
NUM_ENVS, WORKERS = 32, 2
RTT = 0.2e-3  # An assumed network round trip between nodes of one data centre, seconds.
NODES = (1, 2, 4, 8, 16, 32, 64)
LEARNER_BATCHES = (32, 128, 512)


def _constructor(env):
    """The environments of `env`, a key of `ENVS` or a Gymnasium id."""
    from batchrl import environments

    env_id, kwargs = ENVS.get(env, (env, {}))
    limit = 200 if env_id.startswith("benchmarks.slow_envs") else None
    return functools.partial(environments.create, env_id, limit, kwargs=kwargs)


def _batch(kind, env, num_envs=NUM_ENVS, workers=WORKERS, worker_cpus=1.0):
    from batchrl.environments.processes import ParallelBatchEnv
    from batchrl.environments.ray.driver import RayBatchEnv

    if kind == "ray":
        return RayBatchEnv(_constructor(env), num_envs, num_workers=workers,
                           worker_cpus=worker_cpus, name=env)
    return ParallelBatchEnv(_constructor(env), num_envs, num_workers=workers, name=env)


def _raw_call(batch_env):
    """A call that takes one batch step of `batch_env` with random valid actions, resets
    the environments whose episode ended and returns the batch size."""
    from benchmarks.throughput import baselines

    num_envs = len(batch_env)
    actions = itertools.cycle(baselines.action_pool(batch_env.action_space, num_envs))
    batch_env.reset(seed=0)

    def call():
        _, _, terminated, truncated, _ = batch_env.step(next(actions))
        done = terminated | truncated
        if done.any():
            batch_env.reset(np.flatnonzero(done))
        return num_envs

    return call


def _mock_call(batch_env, steps_per_call):
    """A call of the training loop's step function with `MockAlgorithm` over `batch_env`,
    `steps_per_call` batch steps; returns the environment steps it took."""
    from batchrl.environments.in_graph import InGraphBatchEnv
    from batchrl.tools.mock_algorithm import MockAlgorithm
    from benchmarks.throughput import simulate

    batch_env.reset(seed=0)
    in_graph = InGraphBatchEnv(batch_env)
    function = simulate.loop_step_function(in_graph, MockAlgorithm(in_graph, seed=0),
                                           steps_per_call)
    return simulate.simulate_call(function, len(batch_env), steps_per_call)


def measure_pair(env, level, seconds, window, warmup, steps_per_call):
    """`ray` against `parallel` for `env` at `level` (raw or simulate), in alternating
    windows; returns a dict of the ratios (ray / parallel) and both rates."""
    from benchmarks.throughput import baselines

    batches = {kind: _batch(kind, env) for kind in ("ray", "parallel")}
    try:
        calls = {kind: (_raw_call(batch) if level == "raw"
                        else _mock_call(batch, steps_per_call))
                 for kind, batch in batches.items()}
        for call in calls.values():
            baselines.warm_up(call, warmup)
        ratios, totals = [], {kind: [0, 0.0] for kind in calls}
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or not ratios:
            order = list(calls) if len(ratios) % 2 == 0 else list(calls)[::-1]
            rates = {}
            for kind in order:
                steps, elapsed, _ = baselines.timed_window(calls[kind], window)
                rates[kind] = steps / elapsed
                totals[kind][0] += steps
                totals[kind][1] += elapsed
            ratios.append(rates["ray"] / rates["parallel"])
    finally:
        for batch in batches.values():
            batch.close()
    return {"env": env, "level": level, "ratios": ratios,
            "ray": totals["ray"][0] / totals["ray"][1],
            "parallel": totals["parallel"][0] / totals["parallel"][1]}


def measure_single(env, seconds):
    """Seconds per step of one environment of `env` (a key of `ENVS` or a Gymnasium id) in
    a plain loop with random actions, reset when its episode ends: the best of 3 windows
    of `seconds` after 0.3 s of warm-up (float)."""
    from benchmarks.throughput import baselines

    single = _constructor(env)()
    try:
        single.reset(seed=0)
        actions = itertools.cycle(baselines.action_pool(single.action_space, None))

        def call():
            for _ in range(baselines.SINGLE_ENV_CHUNK):
                _, _, terminated, truncated, _ = single.step(next(actions))
                if terminated or truncated:
                    single.reset()
            return baselines.SINGLE_ENV_CHUNK

        baselines.warm_up(call, 0.3)
        windows = [baselines.timed_window(call, seconds) for _ in range(3)]
        return min(elapsed / steps for steps, elapsed, _ in windows)
    finally:
        single.close()


def measure_ray_overhead(seconds):
    """Per batch step of W actors hosting one Pendulum each: `{W: (wall seconds, CPU
    seconds of this process)}`, the best of 3 windows, for W = 1, 2, 4."""
    from batchrl import environments
    from batchrl.environments.ray.driver import RayBatchEnv

    constructor = functools.partial(environments.create, "Pendulum-v1")
    results = {}
    for workers in (1, 2, 4):
        # Ray counts the CPUs it hands out; 4 actors share this machine's 2 here.
        with RayBatchEnv(constructor, workers, num_workers=workers,
                         worker_cpus=WORKERS / 4) as batch_env:
            call = _raw_call(batch_env)
            for _ in range(50):
                call()
            best = None
            for _ in range(3):
                calls, cpu, start = 0, time.process_time(), time.perf_counter()
                while time.perf_counter() - start < seconds:
                    call()
                    calls += 1
                sample = ((time.perf_counter() - start) / calls,
                          (time.process_time() - cpu) / calls)
                best = sample if best is None or sample[0] < best[0] else best
            results[workers] = best
    return results


def measure_learner(batches, steps_per_call, calls=6):
    """The `cheetah` config's BatchPPO collecting (acting and recording, no update) on
    `MockEnvironment`s of HalfCheetah's shapes: `{B: seconds per batch step}`, the median
    of `calls` calls of `steps_per_call` steps after the one that traces."""
    import tensorflow as tf

    from batchrl import build as build_lib
    from batchrl import configs
    from batchrl.drivers.loop import step_function
    from batchrl.environments.local import BatchEnv
    from batchrl.environments.mock import MockEnvironment

    results = {}
    for batch in batches:
        config = configs.load("cheetah", {"num_agents": batch})
        envs = [MockEnvironment((17,), (6,), 1000, 1000) for _ in range(batch)]
        agent = build_lib.build(config, BatchEnv(envs, blocking=True))
        function = step_function(agent.batch_env, agent.algo, steps_per_call)
        false, count = tf.constant(False), tf.constant(steps_per_call)
        # Episodes last 1,000 steps: no episode ends, so no update runs, in these calls.
        function(false, tf.constant(True), count)[0].numpy()
        seconds = []
        for _ in range(calls):
            start = time.perf_counter()
            function(false, false, count)[0].numpy()
            seconds.append((time.perf_counter() - start) / steps_per_call)
        results[batch] = statistics.median(seconds)
    return results


def measure_update(repeats=3):
    """Seconds of one `cheetah` update (10 episodes of 1,000 steps), the median of
    `repeats` after the first (compiling) call."""
    from benchmarks import speed

    memory = speed.play("cheetah", [])
    return statistics.median(speed.measure_update("cheetah", [], repeats, memory)["seconds"])


def _fit(points):
    """Least-squares `(intercept, slope)` of `[(x, y), ...]`."""
    xs, ys = zip(*points, strict=True)
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x in xs))
    return mean_y - slope * mean_x, slope


def costs(figures):
    """The model's constants from the measured figures (seconds)."""
    overhead = {int(w): value for w, value in figures["ray_overhead"].items()}
    _, d = _fit([(w, cpu) for w, (_, cpu) in overhead.items()])
    pendulum = figures["single"]["Pendulum-v1"]
    r = max(0.0, overhead[1][0] - pendulum - d)
    c0, c1 = _fit([(int(b), t) for b, t in figures["learner"].items()])
    return {"r": r, "d": d, "c0": c0, "c1": c1, "u": figures["update_seconds"] / 10_000}


def model(figures, env, nodes, rtt=RTT, envs_per_node=NUM_ENVS, actors_per_node=WORKERS):
    """`(steps/s, environment seconds, round trip seconds, trainer seconds)` of a batch step
    on `nodes` nodes (see the module docstring): the slowest actor's environments, Ray's
    fixed cost and the network's round trip, and the trainer process's own time (Ray's
    cost per actor and the learner)."""
    k = costs(figures)
    batch, actors = envs_per_node * nodes, actors_per_node * nodes
    environment = envs_per_node // actors_per_node * figures["single"][env]
    round_trip = k["r"] + rtt
    trainer = k["d"] * actors + k["c0"] + k["c1"] * batch + k["u"] * batch
    return batch / (environment + round_trip + trainer), environment, round_trip, trainer


def measure(args):
    from batchrl.environments.ray import connection as ray_connection
    from benchmarks.throughput import baselines

    ray_connection.connect(None)
    figures = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "command": " ".join(sys.argv), "cpu_count": os.cpu_count(),
               "load_average": [os.getloadavg()[0]],
               "effective_cores": [baselines.effective_cores()], "pairs": []}
    for env in ENVS:
        for level in ("raw", "simulate"):
            pair = measure_pair(env, level, args.seconds, args.window, args.warmup,
                                args.steps_per_call)
            print(_pair_line(pair), flush=True)
            figures["pairs"].append(pair)
    figures["single"] = {env: measure_single(env, 1.0) for env in [*ENVS, "Pendulum-v1"]}
    figures["ray_overhead"] = measure_ray_overhead(1.0)
    print(f"single env s/step {figures['single']}; Ray per batch step (wall, CPU) by "
          f"actors {figures['ray_overhead']}", flush=True)
    figures["learner"] = measure_learner(LEARNER_BATCHES, args.steps_per_call)
    figures["update_seconds"] = measure_update()
    print(f"learner s/batch step {figures['learner']}; update "
          f"{figures['update_seconds']:.2f} s", flush=True)
    figures["load_average"].append(os.getloadavg()[0])
    figures["effective_cores"].append(baselines.effective_cores())
    ray_connection.disconnect()
    return figures


def _pair_line(pair):
    ratios = pair["ratios"]
    return (f"| {pair['env']} | {pair['level']} | {pair['parallel']:,.0f} | {pair['ray']:,.0f} "
            f"| {statistics.median(ratios):.2f}× | {min(ratios):.2f}–{max(ratios):.2f} "
            f"| {len(ratios)} |")


def performance_section(figures):
    lines = [
        SECTIONS["performance"][0],
        "## The Ray backend against ParallelBatchEnv",
        "",
        f"Written by `python -m benchmarks.ray_scaling` on {figures['date']} (2 workers each, 32 "
        f"environments, a local Ray; effective cores {figures['effective_cores'][0]:.2f} "
        f"at the start and {figures['effective_cores'][1]:.2f} at the end, load average "
        f"{figures['load_average'][0]:.1f} → {figures['load_average'][1]:.1f}: the machine "
        f"was shared with other long runs, so only the ratios, taken in alternating "
        f"windows, compare). `raw`: `step` and `reset` of ended episodes; `simulate`: the "
        f"training loop's step function with `MockAlgorithm`. The scaling model built on "
        f"these and other per-step costs is in [scaling.md](scaling.md).",
        "",
        "| environment | level | ParallelBatchEnv steps/s | RayBatchEnv steps/s | "
        "Ray / Parallel (median) | range | windows |",
        "|---|---|---:|---:|---:|---|---:|",
        *[_pair_line(pair) for pair in figures["pairs"]],
        SECTIONS["performance"][1],
    ]
    return "\n".join(lines) + "\n"


def scaling_section(figures):
    k = costs(figures)
    single = figures["single"]
    lines = [
        SECTIONS["scaling"][0],
        f"Written by `python -m benchmarks.ray_scaling` on {figures['date']} from costs "
        f"measured on this 2-core machine, shared with other runs (effective cores "
        f"{figures['effective_cores'][0]:.2f} → {figures['effective_cores'][1]:.2f}).",
        "",
        "| cost | measured | what |",
        "|---|---:|---|",
        *[f"| `s` {env} | {single[env] * 1e6:,.0f} µs | one environment step, one core |"
          for env in ENVS],
        f"| `r` | {k['r'] * 1e3:.2f} ms | Ray's fixed cost of a batch step (submit, run, "
        f"reply; one actor, minus its Pendulum step) |",
        f"| `d` | {k['d'] * 1e6:,.0f} µs | the trainer's CPU per actor per batch step "
        f"(slope over 1, 2, 4 actors) |",
        f"| `RTT` | {RTT * 1e3:.1f} ms | assumed network round trip between nodes (not "
        f"measured: one machine here) |",
        f"| `c0 + c1 B` | {k['c0'] * 1e3:.2f} ms + {k['c1'] * 1e6:.1f} µs × B | the "
        f"learner's acting and recording per batch step (`cheetah` BatchPPO, "
        f"B = {', '.join(str(b) for b in LEARNER_BATCHES)}: "
        + ", ".join(f"{t * 1e3:.1f} ms" for t in figures["learner"].values()) + ") |",
        f"| `u` | {k['u'] * 1e6:.0f} µs | one `cheetah` update "
        f"({figures['update_seconds']:.2f} s) per environment step it trains on |",
        "",
        "Ray per batch step by actors (wall / this process's CPU): "
        + "; ".join(f"{w}: {wall * 1e3:.2f} / {cpu * 1e3:.2f} ms"
                    for w, (wall, cpu) in figures["ray_overhead"].items()) + ".",
        "",
    ]
    for env in ENVS:
        lines += [f"**{env}**, 32 environments per node (2 actors of 16):", "",
                  "| nodes | environments | steps/s | per node, against 1 node | batch step: "
                  "environments / round trip / trainer (ms) | trainer's share |",
                  "|---:|---:|---:|---:|---|---:|"]
        one = model(figures, env, 1)[0]
        for nodes in NODES:
            rate, environment, round_trip, trainer = model(figures, env, nodes)
            total = environment + round_trip + trainer
            lines.append(
                f"| {nodes} | {NUM_ENVS * nodes:,} | {rate:,.0f} | {rate / nodes / one:.2f}× "
                f"| {environment * 1e3:.1f} / {round_trip * 1e3:.2f} / {trainer * 1e3:.1f} "
                f"| {trainer / total:.0%} |")
        bound = 1 / (k["c1"] + k["u"] + k["d"] * WORKERS / NUM_ENVS)
        crossing = next(n for n in range(1, 100_000)
                        if model(figures, env, n)[3] >= sum(model(figures, env, n)[1:3]))
        lines += ["", f"The trainer's time passes the rest of a batch step at {crossing} "
                  f"node{'s' if crossing > 1 else ''} ({NUM_ENVS * crossing:,} "
                  f"environments); no number of nodes passes {bound:,.0f} steps/s "
                  f"(`1 / (c1 + u + 2d / 32)`).", ""]
    lines += [f"Bounds with less on the trainer: without acting and recording there (`c1` = "
              f"0: actors that act with copies of the policy) "
              f"{1 / (k['u'] + k['d'] * WORKERS / NUM_ENVS):,.0f} steps/s; with one Ray call "
              f"per actor every 50 steps as well (`d / 50`) "
              f"{1 / (k['u'] + k['d'] * WORKERS / NUM_ENVS / 50):,.0f} steps/s; the update "
              f"alone (`1 / u`) {1 / k['u']:,.0f} steps/s, M times that with M learners that "
              f"share the update.", ""]
    lines.append(SECTIONS["scaling"][1])
    return "\n".join(lines) + "\n"


def write_section(path, section, name):
    """Replaces the section `name` of `path` (its markers included) with `section`, or
    appends it."""
    replace_marked(path, section, *SECTIONS[name])


def read_section(path, name="performance"):
    """The section `name` of `path` (markers included), or None."""
    begin, end = SECTIONS[name]
    text = path.read_text() if path.exists() else ""
    if begin not in text or end not in text:
        return None
    return begin + text.split(begin, 1)[1].split(end, 1)[0] + end + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="timed seconds of each pair, all windows together")
    parser.add_argument("--window", type=float, default=1.0, help="seconds of one window")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--steps-per-call", type=int, default=50)
    add_publish_flags(parser, JSON,
                      "the sections of docs/performance.md and docs/scaling.md")
    args = parser.parse_args(argv)
    # The local Ray that `measure` starts hands its environment to the actors.
    os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
    publish(args, JSON, measure, lambda figures: [
        (PERFORMANCE, performance_section(figures), *SECTIONS["performance"]),
        (SCALING, scaling_section(figures), *SECTIONS["scaling"])])
    return 0


if __name__ == "__main__":
    sys.exit(main())

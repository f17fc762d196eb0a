"""Environment steps per second of `ParallelBatchEnv` against the other ways to step a batch.

    .venv/bin/python scripts/parallel_step_benchmark.py
    .venv/bin/python scripts/parallel_step_benchmark.py --envs HalfCheetah-v5 --num-envs 32 \\
        --workers 2 --rounds 5 --seconds 1

For every environment id (`--envs`), in one run and one process, with `--num-envs` (B)
environments built with `batchrl.environments.create` (registered time limit,
actions in [-1, 1], float32 observations), random actions from a pool drawn beforehand, and
the environments whose episode ended reset (`reset(indices)`; Gymnasium's vector
environments autoreset instead, and their reset-only entries are not counted), it measures:

- `single_env`: one environment stepped in a plain Python loop in this process: the
  per-core reference. `os.cpu_count()` times it is the core limit (the rate if stepping were
  perfectly parallel and free of overhead).
- `plain_loops_W`: W worker processes each stepping B / W environments in a plain loop, all
  at the same time, without any communication: the best W workers can do on this machine
  (it includes the cost of many environments per process, whose memory no longer fits the
  caches).
- `batch_env_processes`: `BatchEnv` with one `ExternalProcess` per environment.
- `parallel_W`: `ParallelBatchEnv` with W worker processes (`--workers`).
- `async_vector_env`: Gymnasium's `AsyncVectorEnv` (shared_memory=True, forkserver).
- `overlapped_G` (`--overlap-groups`): the B environments in G groups, hosted by
  `os.cpu_count()` worker processes (group g in worker g mod W), stepped in turn: this
  process waits for group g's step, computes for `--parent-work-us` / G (a policy for that
  group alone, the most favourable split of its time), and sends group g its next actions
  while the other groups step. A schedule that hides the policy's time behind the stepping,
  which `simulate`'s order (actions for every agent, then a step of every environment)
  does not allow; actions and observations in shared memory, one byte per message on pipes.

`--parent-work-us US` makes this process compute for US microseconds (a busy loop) after
every batch step of the batch kinds (`parallel_W`, `batch_env_processes`,
`async_vector_env`), as a policy does between steps in training: it shows how much of the
core limit remains once the workers wait for the policy at every step (`simulate` with
`MockAlgorithm` spends about 125 us per batch step outside the environments' step on the
2-core machine; BatchPPO's inference more).

Everything is built and warmed up first; then `--rounds` rounds each measure every kind for
`--seconds` seconds, one after the other, and the best round of each kind is reported: other
programs' load comes and goes, and the best round is the one least disturbed. Columns: env
steps per second, its ratio to the core limit, to `async_vector_env` and to `plain_loops_W`
of the same W, and `cpu/step`: the CPU time (user + system) of this process and all its
descendants per environment step in that round, relative to `single_env`'s (1.00 = no
overhead; the stepping machinery's cost shows there even when other programs take cores
away). Compare figures within one run only.
"""

import argparse
import functools
import itertools
import multiprocessing
import os
import platform
import time
from multiprocessing import shared_memory

import gymnasium as gym
import numpy as np

from batchrl import environments
from batchrl.environments import wrappers
from batchrl.environments.local import BatchEnv
from batchrl.environments.processes import ParallelBatchEnv

ACTION_POOL = 64
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds():
    """CPU seconds (user + system) used so far by this process and its live descendants
    (workers are children of the fork server, a child of this process)."""
    total, pending, seen = 0.0, [os.getpid()], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as file:
                    pending.extend(int(child) for child in file.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def action_pool(space, batch):
    space.seed(0)
    if batch is None:
        return [space.sample() for _ in range(ACTION_POOL)]
    return [np.stack([space.sample() for _ in range(batch)]) for _ in range(ACTION_POOL)]


class Stepper:
    """A way of stepping environments: `measure(seconds)` returns `(steps/s, CPU s/step)`."""

    def call(self):
        """Takes one batch step (or chunk); returns the env steps it took."""
        raise NotImplementedError

    def warm_up(self, seconds):
        end = time.perf_counter() + seconds
        self.call()
        while time.perf_counter() < end:
            self.call()

    def measure(self, seconds):
        steps, cpu, start = 0, cpu_seconds(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            steps += self.call()
        elapsed = time.perf_counter() - start
        return steps / elapsed, (cpu_seconds() - cpu) / steps

    def close(self):
        pass


class SingleEnv(Stepper):
    def __init__(self, constructor, num_envs):
        self.env = constructor()
        self.env.reset(seed=0)
        self.actions = itertools.cycle(action_pool(self.env.action_space, None))

    def call(self):
        env, actions = self.env, self.actions
        for _ in range(32):
            _, _, terminated, truncated, _ = env.step(next(actions))
            if terminated or truncated:
                env.reset()
        return 32

    def close(self):
        self.env.close()


class PlainLoop:
    """Hosted by an `ExternalProcess`: `step(seconds)` steps its environments in a plain
    loop for that long; returns `(steps, wall seconds, CPU seconds)`."""

    def __init__(self, constructor, count):
        self.envs = [constructor() for _ in range(count)]
        for index, env in enumerate(self.envs):
            env.reset(seed=index)
        self.actions = itertools.cycle(action_pool(self.envs[0].action_space, None))

    def step(self, seconds):
        steps, actions = 0, self.actions
        cpu, start = time.process_time(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            for env in self.envs:
                _, _, terminated, truncated, _ = env.step(next(actions))
                if terminated or truncated:
                    env.reset()
            steps += len(self.envs)
        return steps, time.perf_counter() - start, time.process_time() - cpu

    def close(self):
        for env in self.envs:
            env.close()


class PlainLoops(Stepper):
    """W processes, each stepping its share of the environments, all at the same time."""

    def __init__(self, constructor, num_envs, num_workers):
        counts = [len(group) for group in np.array_split(np.arange(num_envs), num_workers)]
        self.workers = []
        for count in counts:
            self.workers.append(
                wrappers.ExternalProcess(functools.partial(PlainLoop, constructor, count)))

    def run(self, seconds):
        promises = [worker.step(seconds, blocking=False) for worker in self.workers]
        return [promise() for promise in promises]

    def warm_up(self, seconds):
        self.run(seconds)

    def measure(self, seconds):
        results = self.run(seconds)
        steps = sum(steps for steps, _, _ in results)
        rate = sum(steps / elapsed for steps, elapsed, _ in results)
        return rate, sum(cpu for _, _, cpu in results) / steps

    def close(self):
        for worker in self.workers:
            worker.close()


def compute(microseconds):
    """Keeps this process busy for `microseconds` of wall-clock time (a policy's inference)."""
    if microseconds > 0:
        end = time.perf_counter_ns() + int(microseconds * 1000)
        while time.perf_counter_ns() < end:
            pass


class BatchStepper(Stepper):
    """Steps a `BatchEnv` or `ParallelBatchEnv`, resetting the environments that are done,
    then computes for `parent_work_us` microseconds."""

    def __init__(self, batch_env, num_envs, parent_work_us=0.0):
        self.batch_env, self.num_envs = batch_env, num_envs
        self.parent_work_us = parent_work_us
        self.actions = itertools.cycle(action_pool(batch_env.action_space, num_envs))
        batch_env.reset(seed=0)

    def call(self):
        _, _, terminated, truncated, _ = self.batch_env.step(next(self.actions))
        done = terminated | truncated
        if done.any():
            self.batch_env.reset(np.flatnonzero(done))
        compute(self.parent_work_us)
        return self.num_envs

    def close(self):
        self.batch_env.close()


def batch_env_processes(constructor, num_envs, parent_work_us):
    envs = []
    try:
        for index in range(num_envs):
            envs.append(wrappers.ExternalProcess(constructor, name=f"env {index}"))
        return BatchStepper(BatchEnv(envs, blocking=False), num_envs, parent_work_us)
    except BaseException:
        for env in envs:
            env.close()
        raise


class AsyncVectorEnv(Stepper):
    def __init__(self, constructor, num_envs, parent_work_us):
        with wrappers.starting_workers(multiprocessing.get_context("forkserver")):
            self.envs = gym.vector.AsyncVectorEnv(
                [constructor] * num_envs, shared_memory=True, context="forkserver")
        self.num_envs = num_envs
        self.envs.reset(seed=0)
        self.actions = itertools.cycle(action_pool(self.envs.action_space, None))
        self.autoreset = np.zeros(num_envs, bool)
        self.parent_work_us = parent_work_us

    def call(self):
        _, _, terminated, truncated, _ = self.envs.step(next(self.actions))
        stepped = self.num_envs - int(self.autoreset.sum())
        self.autoreset = terminated | truncated
        compute(self.parent_work_us)
        return stepped

    def close(self):
        self.envs.close()


def _serve_groups(constructor, groups, action, observ, commands, replies):
    """A worker of `Overlapped`: builds its groups' environments, then for each byte `g` read
    from `commands` steps group `g` (rows `groups[g]` of the shared `action` and `observ`)
    and answers with the same byte, until end of file.

    First closes every file descriptor the fork copied but `commands`, `replies` and the
    standard streams: a copy of a pipe's write end, its own or another worker's (of this
    kind or another), would keep that pipe's reader from ever seeing end of file."""
    low, high = sorted((commands, replies))
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
    envs = {group: [constructor() for _ in rows] for group, rows in groups.items()}
    for group, rows in groups.items():
        for row, env in zip(rows, envs[group], strict=True):
            env.reset(seed=int(row))
    os.write(replies, b"+")
    while command := os.read(commands, 1):
        group = command[0]
        for row, env in zip(groups[group], envs[group], strict=True):
            observ[row], _, terminated, truncated, _ = env.step(action[row])
            if terminated or truncated:
                observ[row], _ = env.reset()
        os.write(replies, command)


class Overlapped(Stepper):
    """G groups of environments stepped in turn by worker processes, the policy's time
    (`parent_work_us / G` per group) overlapping the other groups' steps."""

    def __init__(self, constructor, num_envs, num_groups, parent_work_us):
        if not 1 <= num_groups <= min(num_envs, 255):
            raise ValueError(f"overlap groups must be 1 to min(B, 255) = "
                             f"{min(num_envs, 255)}, got {num_groups}")
        env = constructor()
        action_space, observation_space = env.action_space, env.observation_space
        env.close()
        self.num_envs, self.num_groups = num_envs, num_groups
        self.group_work_us = parent_work_us / num_groups
        self.rows = [rows.tolist() for rows in np.array_split(np.arange(num_envs), num_groups)]
        self.actions = itertools.cycle(action_pool(action_space, num_envs))
        action_shape = (num_envs, *action_space.shape)
        observ_shape = (num_envs, *observation_space.shape)
        action_bytes = int(np.prod(action_shape)) * np.dtype(action_space.dtype).itemsize
        self.memory = shared_memory.SharedMemory(
            create=True, size=action_bytes + int(np.prod(observ_shape)) * 4)
        self.action = np.ndarray(action_shape, action_space.dtype, self.memory.buf)
        self.observ = np.ndarray(observ_shape, np.float32, self.memory.buf, action_bytes)
        self.commands, self.replies, self.processes = [], [], []
        try:
            self._start(constructor)
        except BaseException:
            self.close()
            raise

    def _start(self, constructor):
        num_workers = min(self.num_groups, os.cpu_count() or 1)
        context = multiprocessing.get_context("fork")  # Inherits the memory and the pipes.
        for worker in range(num_workers):
            command_read, command_write = os.pipe()
            reply_read, reply_write = os.pipe()
            self.commands.append(command_write)
            self.replies.append(reply_read)
            groups = {g: self.rows[g] for g in range(self.num_groups)
                      if g % num_workers == worker}
            process = context.Process(
                target=_serve_groups, daemon=True,
                args=(constructor, groups, self.action, self.observ, command_read, reply_write))
            process.start()
            os.close(command_read)
            os.close(reply_write)
            self.processes.append(process)
        for reply in self.replies:
            self._read(reply)  # Built.
        actions = next(self.actions)
        for group in range(self.num_groups):
            self._send(group, actions)

    def _read(self, reply):
        if not os.read(reply, 1):
            raise RuntimeError(f"a worker of overlapped_{self.num_groups} stopped")

    def _send(self, group, actions):
        compute(self.group_work_us)
        rows = self.rows[group]
        self.action[rows] = actions[rows]
        os.write(self.commands[group % len(self.commands)], bytes([group]))

    def call(self):
        actions = next(self.actions)
        for group in range(self.num_groups):
            # A worker answers its groups in the order they were sent: this is group's.
            self._read(self.replies[group % len(self.replies)])
            self._send(group, actions)
        return self.num_envs

    def close(self):
        for fd in self.commands + self.replies:
            os.close(fd)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
        del self.action, self.observ
        self.memory.close()
        self.memory.unlink()


def steppers(env_id, num_envs, workers, skip, parent_work_us=0.0, overlap_groups=()):
    """`{kind: zero-argument factory of its Stepper}`, in report order."""
    constructor = functools.partial(environments.create, env_id)  # Registered time limit.
    kinds = {"single_env": functools.partial(SingleEnv, constructor, num_envs)}
    for count in workers:
        if "plain_loops" not in skip:
            kinds[f"plain_loops_{count}"] = functools.partial(
                PlainLoops, constructor, num_envs, count)
        kinds[f"parallel_{count}"] = lambda count=count: BatchStepper(
            ParallelBatchEnv(constructor, num_envs, count, name=env_id), num_envs,
            parent_work_us)
    if "batch_env_processes" not in skip:
        kinds["batch_env_processes"] = functools.partial(
            batch_env_processes, constructor, num_envs, parent_work_us)
    if "async_vector_env" not in skip:
        kinds["async_vector_env"] = functools.partial(
            AsyncVectorEnv, constructor, num_envs, parent_work_us)
    for count in overlap_groups:
        kinds[f"overlapped_{count}"] = functools.partial(
            Overlapped, constructor, num_envs, count, parent_work_us)
    return kinds


def benchmark(env_id, args):
    """Builds every kind, measures `args.rounds` interleaved rounds, prints the best."""
    built, rounds = {}, {}
    try:
        for kind, factory in steppers(env_id, args.num_envs, args.workers, args.skip,
                                         args.parent_work_us, args.overlap_groups).items():
            built[kind] = factory()
            built[kind].warm_up(args.warmup)
        for _ in range(args.rounds):
            for kind, stepper in built.items():
                rounds.setdefault(kind, []).append(stepper.measure(args.seconds))
    finally:
        for stepper in built.values():
            stepper.close()
    best = {kind: max(results) for kind, results in rounds.items()}
    cores = os.cpu_count()
    single_rate, single_cpu = best["single_env"]
    core_limit = cores * single_rate
    asynchronous = best.get("async_vector_env", (None,))[0]
    print(f"\n{env_id}, B = {args.num_envs}: core limit {cores} x single_env = "
          f"{core_limit:,.0f} steps/s (best of {args.rounds} rounds of {args.seconds:g} s; "
          f"parent work {args.parent_work_us:g} us per batch step; "
          f"load average {os.getloadavg()[0]:.2f} at the end)")
    print(f"  {'kind':20s} {'steps/s':>9s} {'/limit':>7s} {'/async':>7s} {'/plain':>7s} "
          f"{'cpu/step':>8s}   rounds (steps/s)")
    for kind, (rate, cpu) in best.items():
        plain = best.get("plain_loops_" + kind.rsplit("_", 1)[1]) \
            if kind.startswith("parallel_") else None
        if kind.startswith("overlapped_"):
            plain = best.get(f"plain_loops_{min(int(kind.rsplit('_', 1)[1]), cores)}")
        columns = [
            f"{rate / core_limit:7.2f}",
            f"{rate / asynchronous:7.2f}" if asynchronous else f"{'-':>7s}",
            f"{rate / plain[0]:7.2f}" if plain else f"{'-':>7s}",
            f"{cpu / single_cpu:8.2f}",
        ]
        others = " ".join(f"{value:,.0f}" for value, _ in rounds[kind])
        print(f"  {kind:20s} {rate:9,.0f} {' '.join(columns)}   {others}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5", "Pendulum-v1"])
    parser.add_argument("--num-envs", type=int, default=32, help="the batch size B")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4],
                        help="worker counts W of ParallelBatchEnv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per kind and round")
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["plain_loops", "batch_env_processes", "async_vector_env"])
    parser.add_argument("--parent-work-us", type=float, default=0.0,
                        help="microseconds this process computes after every batch step of "
                             "the batch kinds, as a policy would")
    parser.add_argument("--overlap-groups", type=int, nargs="*", default=[],
                        help="group counts G of the overlapped_G kinds (e.g. 2 4)")
    args = parser.parse_args(argv)
    print(f"{platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} at the start", flush=True)
    for env_id in args.envs:
        benchmark(env_id, args)


if __name__ == "__main__":
    main()

"""A batch of environments hosted by Ray actors, on this machine or across a Ray cluster.

Free of TensorFlow, and Ray is imported only when a `RayBatchEnv` is built (Ray is the
optional extra `batchrl[ray]`).

Each actor (`EnvGroup`, in `batchrl.environments.ray.actor`, which the actors import) hosts a
contiguous group of the batch's environments, as a `ParallelBatchEnv` worker does, and
answers three calls: `build` (construct the environments, describe their spaces),
`step(actions)` (step each environment of the group once; the result is four NumPy arrays,
or a problem tuple naming the environment that raised) and `reset(local_indices, seed)`.
A batch step submits one `step` call per actor and waits for all of them with one
`ray.get`. Ray serializes NumPy arrays out of band (pickle protocol 5): the arrays an actor
returns arrive as read-only views of the reply's buffer, and the only copy in this process
is the one that joins the groups into the batch's arrays.
"""

import contextlib
import logging
import re
import time
import weakref

import numpy as np

from batchrl.environments.processes import _describe
from batchrl.environments.ray import connection as ray_connection
from batchrl.environments.ray.actor import RAISED, EnvGroup, Problem
from batchrl.environments.ray.connection import RayUnavailable
from batchrl.environments.worker import WorkerBatchEnv
from batchrl.environments.wrappers import WorkerError

__all__ = ["NotEnoughCPUs", "RayBatchEnv", "RayUnavailable"]

_logger = logging.getLogger(__name__)


class NotEnoughCPUs(ValueError):
    """The actors ask for more CPUs than the Ray cluster has."""


class RayBatchEnv(WorkerBatchEnv):
    """`B` environments stepped together by `W` Ray actors, each hosting a contiguous group.

    Same interface and semantics as `ParallelBatchEnv` (`BaseBatchEnv`'s `step` and `reset`
    of chosen indices with seeds and their checks, `len`, `observation_space`,
    `action_space`, `close`, context manager, `blocking` False, infos not transported, the
    same errors naming the environments; actions converted to the action space's dtype,
    each actor receiving its rows), with
    the actors placed by Ray: on this machine or on any node of a cluster (Ray's `SPREAD`
    strategy spreads them over the nodes).

    Faults: an exception in an environment, a NaN or infinite result, or an observation of
    the wrong shape closes the batch and raises, as `ParallelBatchEnv` does. An actor that
    died, or did not answer within `timeout` (it is then killed), closes the batch and raises
    `WorkerError` naming the environments it hosted, unless `restarts` allows it to be
    restarted: a new actor then builds its environments and resets them (environment `i`
    with seed `seed + i + B * r` after `reset(seed=seed)`, r the batch's restarts so far),
    the restart is logged (logger `batchrl.environments.ray.driver`, level WARNING) and the call
    returns normally. The environments of a restarted actor begin new episodes: for the
    step during which it was restarted they return their new first observation, reward 0,
    `terminated` False and `truncated` True, and `interrupted` flags them, so that a caller
    such as `simulate` does not count their cut-short episodes.

    Ray's processes: when this process is not connected to Ray yet, the batch connects it
    (`address` None: a local Ray is started with `ray.init("local")`; "auto" or
    "HOST:PORT": a running cluster is joined); when the last such batch is closed, the
    connection ends, which stops a local Ray the batch started and leaves a joined cluster
    running. Ray's own reaper ends a local Ray when this process dies. A connection that was
    there before is used as it is and left open.

    Not thread-safe: use each instance from one thread at a time.

    Args:
      constructor: zero-argument callable returning a `gymnasium.Env`, called once per
        environment in its actor; pickled by Ray (cloudpickle). Environments differ only by
        their seeds. The observation space needs a fixed shape, the action space a shape and
        a numeric dtype. Every node must be able to import what it refers to (batchrl and
        the environment's package installed there).
      num_envs: the batch size `B`, a positive int.
      num_workers: the number of actors `W`, a positive int; None for one per
        `worker_cpus` CPUs of the cluster. At most `num_envs` are started.
      worker_cpus: CPUs Ray reserves for each actor (float > 0).
      timeout: seconds to wait for any answer of an actor (one step or reset of its
        group) before it counts as hung; starting an actor and building its environments
        (at the start or in a restart) may take at least `ray_connection.START_SECONDS`
        (a new Ray worker process imports Gymnasium, which takes seconds on a busy host).
      restarts: how many times each actor may be restarted after it died or hung (int >= 0).
      address: None, "auto" or "HOST:PORT" (see above); ignored when this process is
        already connected to Ray.
      name: the environments' name in error messages (default: their `spec.id`).

    Raises:
      ValueError: an invalid argument, or spaces that differ between environments (the
        message names the index and both spaces) or are not supported.
      NotEnoughCPUs: the actors need more CPUs than the Ray cluster has.
      RayUnavailable: Ray is not installed, or cannot be started or reached at `address`.
      WorkerError: an environment's constructor raised (naming its index, with the actor's
        traceback), or an actor died or did not answer in time.
    """

    def __init__(self, constructor, num_envs, num_workers=None, worker_cpus=1.0, timeout=60.0,
                 restarts=0, address=None, name=None):
        for key, value, least in (("num_envs", num_envs, 1), ("num_workers", num_workers, 1),
                                  ("restarts", restarts, 0)):
            if not (value is None and key == "num_workers") and (
                    isinstance(value, bool) or not isinstance(value, int | np.integer)
                    or value < least):
                raise ValueError(f"{key} must be an int >= {least}, got {value!r}")
        for key, value in (("worker_cpus", worker_cpus), ("timeout", timeout)):
            if not float(value) > 0:
                raise ValueError(f"{key} must be positive, got {value!r}")
        self._num_envs = int(num_envs)
        self._worker_cpus = float(worker_cpus)
        self._timeout = float(timeout)
        self._start_timeout = max(self._timeout, ray_connection.START_SECONDS)
        self._max_restarts = restarts
        self._named = name is not None
        self._label = name if name is not None else _describe(constructor)
        self._constructor = constructor
        self._seed = None  # The seed of the latest seeded reset.
        self._restarted = 0  # Restarts of the batch so far.
        self._interrupted = np.zeros(self._num_envs, bool)  # Of the latest step.
        self._pending = np.zeros(self._num_envs, bool)  # Cut short, not yet reported.
        self._closed = None  # Why the batch is closed, once it is.
        self._actors = []
        self._ray = ray_connection.connect(
            address, max(self._timeout, ray_connection.START_SECONDS))
        self._finalizer = weakref.finalize(self, _release, self._actors, [True])
        try:
            self._start(num_workers)
        except BaseException:
            self._close("the batch failed to start")
            raise

    # Public interface.

    @property
    def worker_pids(self):
        """The process id of each actor (tuple of int; on its own node), in group order."""
        return tuple(info["pid"] for info in self._info)

    @property
    def worker_nodes(self):
        """The Ray node id (hex str) each actor runs on, in group order."""
        return tuple(info["node"] for info in self._info)

    @property
    def restarts(self):
        """How often each actor was restarted so far (tuple of int), in group order."""
        return tuple(self._restarts)

    @property
    def interrupted(self):
        """bool `[B]`: the environments whose episodes the latest `step` cut short (their
        actor was restarted), or None when `restarts` is 0 (nothing is ever cut short)."""
        return self._interrupted.copy() if self._max_restarts else None

    def _step(self, actions):
        """Steps every actor's group; returns new arrays and `B` empty dicts.

        An actor restarted during the step gives its environments' new first observations,
        reward 0, terminated False and truncated True (`interrupted`).
        """
        if self._closed is not None:
            raise WorkerError(f"{self!r}: {self._closed}")
        actions = actions.astype(self._action_dtype, casting="same_kind", copy=False)
        calls = {k: ("step", (actions[first:first + count],))
                 for k, (first, count) in enumerate(self._groups)}
        results, restarted = self._call(calls)
        for k in restarted:
            first, count = self._groups[k]
            fresh = results[k]
            results[k] = (fresh, np.zeros(count, np.float32), np.zeros(count, bool),
                          np.ones(count, bool))
        observ, reward, terminated, truncated = (
            np.concatenate([results[k][i] for k in range(len(self._groups))])
            for i in range(4))
        interrupted, self._pending = self._pending, np.zeros(self._num_envs, bool)
        for k in restarted:
            interrupted[self.groups[k]] = True
        if interrupted.any():
            reward[interrupted] = 0.0
            terminated[interrupted] = False
            truncated[interrupted] = True
        self._interrupted = interrupted
        return observ, reward, terminated, truncated, tuple({} for _ in range(self._num_envs))

    def _reset(self, indices, seed):
        """Resets the environments at `indices` in their actors; returns a new array in the
        order of `indices` and empty dicts."""
        if self._closed is not None:
            raise WorkerError(f"{self!r}: {self._closed}")
        if seed is not None:
            self._seed = seed
        ordered = np.sort(indices)
        owners = self._owner[ordered]
        calls = {}
        for k in np.unique(owners).tolist():
            local = (ordered[owners == k] - self._groups[k][0]).tolist()
            calls[k] = ("reset", (local, seed))
        results, restarted = self._call(calls)
        for k in restarted:  # Fresh observations of the whole group: keep the requested.
            first, count = self._groups[k]
            requested = np.zeros(count, bool)
            requested[ordered[owners == k] - first] = True
            results[k] = results[k][requested]
            self._pending[first:first + count] |= ~requested
        observ = np.concatenate([results[k] for k in calls])[
            np.searchsorted(ordered, indices)]
        self._pending[indices] = False
        return observ, tuple({} for _ in range(len(indices)))

    # Start-up.

    def _start(self, num_workers):
        ray = self._ray
        cluster_cpus = float(ray.cluster_resources().get("CPU", 0))
        if num_workers is None:
            num_workers = max(1, int(cluster_cpus // self._worker_cpus))
        num_workers = min(int(num_workers), self._num_envs)
        if num_workers * self._worker_cpus > cluster_cpus:
            raise NotEnoughCPUs(
                f"{num_workers} Ray actors of {self._worker_cpus:g} CPUs each (num_workers, "
                f"worker_cpus) need {num_workers * self._worker_cpus:g} CPUs; the Ray cluster "
                f"has {cluster_cpus:g}")
        base, extra = divmod(self._num_envs, num_workers)
        counts = [base + (k < extra) for k in range(num_workers)]
        firsts = np.cumsum([0] + counts[:-1]).tolist()
        self._groups = list(zip(firsts, counts, strict=True))
        self._owner = np.repeat(np.arange(num_workers), counts)
        self._names = [
            (f"env {first}" if count == 1 else f"envs {first}-{first + count - 1}")
            + f" ({self._label})" for first, count in self._groups]
        self._restarts = [0] * num_workers
        self._info = [{"pid": None, "node": None, "where": "not started"}] * num_workers
        self._remote = ray.remote(EnvGroup)
        self._actors.extend(self._new_actor(k) for k in range(num_workers))
        replies, restarted = self._call({k: ("build", ()) for k in range(num_workers)},
                                        restart=False, timeout=self._start_timeout)
        assert not restarted
        described = []
        for k in range(num_workers):
            self._info[k] = replies[k]
            described.extend(replies[k]["envs"])
        if not self._named:
            self._label = described[0][2]
            self._names = [name.rsplit(" (", 1)[0] + f" ({self._label})"
                           for name in self._names]
        self._init_contract(self._num_envs, *described[0][:2])
        self._check_spaces(described)

    def _new_actor(self, k):
        first, count = self._groups[k]
        return self._remote.options(
            num_cpus=self._worker_cpus, scheduling_strategy="SPREAD", max_restarts=0,
            max_task_retries=0).remote(self._constructor, first, count)

    # Calls and faults.

    def _call(self, calls, restart=True, timeout=None):
        """Makes one call per actor (`{k: (method, args)}`) and waits for all answers, up to
        `timeout` seconds (default: the batch's `timeout`).

        Returns `(results, restarted)`: `{k: result}`, and the actors restarted in place of
        ones that died or hung (their result is the observation of all their environments
        after the restart's reset). Closes the batch, then raises, on any other failure:
        an actor failure first, else the environment problem of the lowest batch index.
        """
        ray = self._ray
        try:
            refs = {k: getattr(self._actors[k], method).remote(*args)
                    for k, (method, args) in calls.items()}
            timeout = self._timeout if timeout is None else timeout
            deadline = time.monotonic() + timeout
            try:
                values = ray.get(list(refs.values()), timeout=timeout)
                results = dict(zip(refs, values, strict=True))
                failures = {}
            except ray.exceptions.RayError:  # Which actors failed, and how.
                results, failures = self._sort_out(refs, deadline, timeout)
            final = [k for k, (_, restartable) in sorted(failures.items())
                     if not (restart and restartable and self._restarts[k] < self._max_restarts)]
            if final:
                raise WorkerError(failures[final[0]][0])
            problems = [value for value in results.values() if isinstance(value, Problem)]
            if problems:
                raise self._problem_error(problems)
            for k, (why, _) in sorted(failures.items()):
                results[k] = self._restart(k, why)
        except BaseException as error:  # E.g. KeyboardInterrupt: actors are mid-call.
            self._fail(error)
        return results, sorted(failures)

    def _sort_out(self, refs, deadline, timeout):
        """After a failed `ray.get`: `(results, failures)`, failures mapping each actor that
        failed to `(error message, whether a restart may replace it)`: actors that died or
        did not answer by `deadline` (killed then) may be replaced, a Ray error of the call
        itself may not."""
        ray = self._ray
        remaining = max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=remaining)
        ready = set(ready)
        results, failures = {}, {}
        for k, ref in refs.items():
            where = f"the Ray actor ({self._info[k]['where']})"
            if ref not in ready:
                with contextlib.suppress(Exception):
                    ray.kill(self._actors[k], no_restart=True)
                failures[k] = (f"{self._names[k]}: {where} did not answer within "
                               f"{timeout:g} s and was killed", True)
                continue
            try:
                results[k] = ray.get(ref)
            except ray.exceptions.RayActorError as error:
                failures[k] = (f"{self._names[k]}: {where} died: {_reason(error)}", True)
            except ray.exceptions.RayError as error:
                failures[k] = (f"{self._names[k]}: {where} failed: {error}", False)
        return results, failures

    def _restart(self, k, why):
        """Replaces actor `k` (dead or hung) by a new one, builds and resets its
        environments; returns their observations float32 `[count, *observation_shape]`."""
        ray = self._ray
        with contextlib.suppress(Exception):
            ray.kill(self._actors[k], no_restart=True)
        self._restarts[k] += 1
        self._restarted += 1
        self._actors[k] = self._new_actor(k)
        first, count = self._groups[k]
        seed = None if self._seed is None else self._seed + self._num_envs * self._restarted
        try:
            info = ray.get(self._actors[k].build.remote(), timeout=self._start_timeout)
            if isinstance(info, Problem):
                raise self._problem_error([info])
            self._check_spaces(info["envs"], first)
            self._info[k] = info
            observ = ray.get(self._actors[k].reset.remote(list(range(count)), seed),
                             timeout=self._timeout)
            if isinstance(observ, Problem):
                raise self._problem_error([observ])
        except ray.exceptions.RayError as error:
            raise WorkerError(f"{why}; restarting it failed: {type(error).__name__}: "
                              f"{' '.join(str(error).split())[:300]}") from None
        _logger.warning("%s; restarted it as a new Ray actor (%s), restart %d of %d: its "
                        "environments begin new episodes", why, info["where"],
                        self._restarts[k], self._max_restarts)
        return observ

    def _problem_error(self, problems):
        """The exception of the most important problem: an environment's exception first,
        then the lowest batch index."""
        problem = min(problems, key=lambda problem: (problem.kind != RAISED, problem.index))
        if problem.kind == RAISED:
            return WorkerError(f"env {problem.index} ({self._label}): {problem.what} raised in "
                               f"the Ray actor ({problem.where}):\n{problem.text}")
        return ValueError(f"env {problem.index} returned an observation of shape "
                          f"{problem.what}, expected {self._observ_shape}: {problem.text}")


def _release(actors, connected):
    """Kills the actors, then ends this batch's use of the Ray connection (`connected[0]`:
    whether it counts as a user). Safe to call repeatedly."""
    if actors:
        import ray

        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        actors.clear()
    if connected[0]:
        connected[0] = False
        ray_connection.disconnect()


def _reason(error):
    """The gist of a `RayActorError`: how its worker process ended, as Ray reports it."""
    lines = [line for line in str(error).splitlines()
             if not re.match(r"\s*(class_name|actor_id|pid|name|namespace|ip):", line)]
    text = " ".join(" ".join(lines).split())
    kind = re.search(r"Worker exit type: (\S+)", text)
    detail = re.search(r"Worker exit detail: (.*?\.(?: End of file\.)?)(?: |$)", text)
    if kind and detail:
        return f"its worker process exited ({kind.group(1)}: {detail.group(1)})"
    text = text.replace("The actor died unexpectedly before finishing this task. ", "")
    return text if len(text) <= 200 else text[:197] + "..."

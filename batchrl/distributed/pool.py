"""The actors of an actor-learner run, as Ray actors, and the fragments they record: bounded
in flight, restarted when they fail, and given the learner's newest weights."""

import collections
import contextlib
import logging
import time

from batchrl.distributed.actor import FragmentActor
from batchrl.environments.ray import connection
from batchrl.environments.ray.driver import NotEnoughCPUs, _reason
from batchrl.environments.wrappers import WorkerError

_logger = logging.getLogger(__name__)

Fragment = collections.namedtuple("Fragment", "actor, version, fragment, scores, lengths, "
                                              "seconds, queued")
Fragment.__doc__ = """A fragment that reached the learner: the index of the `actor` that
recorded it, the policy `version` that acted, the `fragment` arrays
(`FragmentRecorder.collect`), the `scores` and `lengths` of the episodes that ended in it,
the `seconds` the actor took to record it, and how many fragments were `queued` (ready and
waiting, this one included) when the learner took it."""


class ActorPool:
    """`count` Ray actors (`actor.FragmentActor`, or another `actor_class`), each recording
    fragments (or an Ape-X actor's transitions) with the weights
    last `publish`ed, at most `in_flight` calls ahead of the learner: no more than
    `count * in_flight` fragments exist at once, in flight or waiting in the object store.

    An actor whose call raised (its environment failed), whose process died, or that did
    not finish a call within `timeout` seconds of starting it is killed and replaced by a
    new one (its calls in flight are discarded and counted in `discarded`), up to
    `restarts` times per actor; the next failure raises `WorkerError` naming it. Weights
    travel through the object store once per `publish`, whatever the number of actors,
    and reach every actor at once, on a thread of its own while it records
    (`FragmentActor.take_weights`, in the concurrency group "weights"): a call acts with
    the newest weights published when it starts, not when it was queued.

    Args:
      config: the run's `Config` as loaded (`actor.FragmentActor`).
      count: int >= 1, the actors.
      cpus: float > 0, the CPUs Ray reserves for each.
      in_flight: int >= 1, calls per actor.
      timeout: float > 0, seconds a call may take (building an actor: at least
        `connection.START_SECONDS`).
      restarts: int >= 0, restarts per actor.
      address: None (start a local Ray, stopped by `close`) or a Ray cluster's address.
      runtime_env: optional dict, Ray's runtime environment of the actors' processes
        (e.g. `env_vars`).
      setup: optional callable that each actor calls first (`FragmentActor`).
      actor_class: the actors' class: `actor.FragmentActor` (fragments, for impala and
        appo) or `actor.TransitionActor` (n-step transitions, Ape-X).
      first_index: int >= 0, the run's index of the first actor (`actor.actor_config`:
        its seeds), for the pool of one of several learners (`learners.actor_indices`).

    The actors start building (`FragmentActor.build`) at once; `wait_built`, or the first
    call that needs them, waits for them.

    Raises:
      RayUnavailable: Ray cannot be started or reached.
      NotEnoughCPUs: the cluster has fewer CPUs than the actors need.
    """

    def __init__(self, config, count, cpus, in_flight, timeout, restarts, address=None,
                 runtime_env=None, setup=None, actor_class=FragmentActor, first_index=0):
        self._config = config
        self._first_index = int(first_index)
        self._cpus = float(cpus)
        self._in_flight = int(in_flight)
        self._timeout = float(timeout)
        self._max_restarts = int(restarts)
        self._runtime_env = runtime_env
        self._setup = setup
        self._ray = connection.connect(address, max(self._timeout, connection.START_SECONDS))
        self._actors = [None] * int(count)
        self.restarts = [0] * int(count)
        self.discarded = 0  # Calls in flight lost with an actor that failed.
        self._info = [None] * int(count)
        self._pending = {}  # ObjectRef -> actor index, in submission order.
        self._started = [None] * int(count)  # When each actor's oldest call began.
        # The newest publication: (number, version, ObjectRef of the arrays), or None.
        self._weights = None
        self._builds = None  # The actors' `build` calls, until `wait_built`.
        try:
            cluster = float(self._ray.cluster_resources().get("CPU", 0))
            if count * self._cpus > cluster:
                raise NotEnoughCPUs(
                    f"{count} actors of {self._cpus:g} CPUs each (actors, actor_cpus) need "
                    f"{count * self._cpus:g} CPUs; the Ray cluster has {cluster:g}")
            self._remote = self._ray.remote(concurrency_groups={"weights": 1})(actor_class)
            for index in range(count):
                self._actors[index] = self._new_actor(index)
            self._builds = [actor.build.remote() for actor in self._actors]
        except BaseException:
            self.close()
            raise

    def wait_built(self):
        """Waits until every actor has built its environments and policy (the constructor
        only starts them, so that the caller can build the learner meanwhile); at once
        after the first call.

        Raises:
          WorkerError: an actor's build raised, its process died, or it took longer than
            the build's timeout; the pool is closed then.
        """
        builds, self._builds = self._builds, None
        try:
            for index, ref in enumerate(builds or ()):
                self._info[index] = self._get_build(index, ref)
        except BaseException:
            self.close()
            raise

    @property
    def nodes(self):
        """The Ray node of each actor (tuple of str), in actor order (`wait_built` first)."""
        self.wait_built()
        return tuple(info["node"] for info in self._info)

    @property
    def agents(self):
        """The environments of all actors (int; `wait_built` first)."""
        self.wait_built()
        return sum(info["agents"] for info in self._info)

    def describe(self, index):
        """Where actor `index` runs (str: host and pid; `wait_built` first)."""
        self.wait_built()
        return self._info[index]["where"]

    def publish(self, version, weights):
        """Makes `weights` (list of arrays: `Actor.get_weights`) of policy `version` (int)
        the ones every call that starts from now on acts with: one object-store put, sent
        to every actor at once (`FragmentActor.take_weights`)."""
        number = self._weights[0] + 1 if self._weights else 0
        self._weights = (number, int(version), self._ray.put(weights))
        for index in range(len(self._actors)):
            self._send_weights(index)

    def next(self):
        """The next fragment any actor finished (`Fragment`), after topping every actor up
        to `in_flight` calls with the latest weights; restarts the actors that fail
        meanwhile.

        Raises:
          WorkerError: an actor failed after its last restart.
        """
        self.wait_built()
        ray = self._ray
        while True:
            self._top_up()
            refs = list(self._pending)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            if not ready:
                ready, _ = ray.wait(refs, num_returns=1, timeout=self._wait_seconds())
            if ready:
                queued = len(ready)
                ref = min(ready, key=refs.index)  # The oldest call that is done.
                index = self._pending.pop(ref)
                self._started[index] = time.monotonic()
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError as error:
                    self._restart(index, f"died: {_reason(error)}")
                    continue
                except ray.exceptions.RayTaskError as error:
                    self._restart(index, f"failed: {_task_error(error)}")
                    continue
                except ray.exceptions.RayError as error:  # E.g. its result was lost.
                    self._restart(index, f"failed: {type(error).__name__}: {error}"[:300])
                    continue
                return Fragment(index, result["version"], result["fragment"],
                                result["scores"], result["lengths"], result["seconds"],
                                queued)
            now = time.monotonic()
            for index, started in enumerate(self._started):
                if started is not None and now - started > self._timeout:
                    self._restart(index, f"did not finish a fragment within "
                                         f"{self._timeout:g} s")

    def close(self):
        """Kills the actors and ends this pool's use of Ray (stopping a Ray it started).
        Safe to call repeatedly."""
        actors = [actor for actor in self._actors if actor is not None]
        self._actors = [None] * len(self._actors)
        self._pending.clear()
        if self._ray is None:
            return
        for actor in actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)
        self._ray = None
        connection.disconnect()

    def _send_weights(self, index):
        """Sends the newest publication to actor `index` (nothing before the first)."""
        if self._weights is not None and self._actors[index] is not None:
            take = self._actors[index].take_weights.options(concurrency_group="weights")
            take.remote(*self._weights)

    def _new_actor(self, index):
        # Without task events: Ray's GCS keeps those of up to 100,000 tasks (for its
        # dashboard), and every fragment is a task. With them, the GCS of a cartpole_impala
        # run grew from 46 to 123 MB in its first 14 minutes; without, 46 to 48 MB.
        options = dict(num_cpus=self._cpus, max_restarts=0, max_task_retries=0,
                       max_concurrency=1, scheduling_strategy="SPREAD",
                       enable_task_events=False)
        if self._runtime_env:
            options["runtime_env"] = self._runtime_env
        return self._remote.options(**options).remote(
            self._config, self._first_index + index, self._setup, self.restarts[index])

    def _get_build(self, index, ref):
        ray = self._ray
        try:
            return ray.get(ref, timeout=max(self._timeout, connection.START_SECONDS))
        except ray.exceptions.GetTimeoutError:
            raise WorkerError(f"actor {index}: not built within "
                              f"{max(self._timeout, connection.START_SECONDS):g} s") from None
        except ray.exceptions.RayTaskError as error:
            raise WorkerError(f"actor {index}: building its environments and policy "
                              f"failed: {_task_error(error)}") from None
        except ray.exceptions.RayActorError as error:
            raise WorkerError(f"actor {index}: died while building: "
                              f"{_reason(error)}") from None

    def _top_up(self):
        publication = self._weights[0] if self._weights else None
        for index, actor in enumerate(self._actors):
            calls = sum(1 for owner in self._pending.values() if owner == index)
            if not calls:
                self._started[index] = time.monotonic()
            for _ in range(self._in_flight - calls):
                self._pending[actor.collect.remote(publication=publication)] = index

    def _wait_seconds(self):
        """Seconds until the oldest call of any actor runs out of time (at least 0.01)."""
        now = time.monotonic()
        deadlines = [started + self._timeout for started in self._started
                     if started is not None]
        return max(0.01, min(deadlines) - now) if deadlines else self._timeout

    def _restart(self, index, why):
        """Replaces actor `index` by a new one (its calls in flight discarded), or raises
        `WorkerError` when it has used its restarts."""
        ray = self._ray
        where = self.describe(index)
        lost = [ref for ref, owner in self._pending.items() if owner == index]
        for ref in lost:
            del self._pending[ref]
        self.discarded += len(lost)
        with contextlib.suppress(Exception):
            ray.kill(self._actors[index], no_restart=True)
        message = f"actor {index} ({where}) {why}"
        if self.restarts[index] >= self._max_restarts:
            raise WorkerError(f"{message} (worker_restarts: {self._max_restarts} used)")
        self.restarts[index] += 1
        self._actors[index] = self._new_actor(index)
        self._info[index] = self._get_build(index, self._actors[index].build.remote())
        self._send_weights(index)
        self._started[index] = None
        _logger.warning("%s; restarted it (%s), restart %d of %d", message,
                        self.describe(index), self.restarts[index], self._max_restarts)


def _task_error(error):
    """The gist of a `RayTaskError`: the exception the actor's call raised, on one line."""
    cause = getattr(error, "cause", None)
    if cause is not None:
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = str(error).strip().splitlines()[-1]
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."

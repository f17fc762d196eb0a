"""The actor side of `RayBatchEnv`: a group of environments hosted by one Ray actor.

Free of TensorFlow and of Ray at import: Ray imports this module in each actor's process.
The actor answers `build`, `step(actions)` and `reset(local_indices, seed)` (see
`batchrl.environments.ray.driver`); each returns its result or, when an environment failed, a
`Problem`.
"""

import collections
import os
import traceback

import numpy as np

from batchrl.environments.process_group import BAD_SHAPE, RAISED, build_group

__all__ = ["BAD_SHAPE", "RAISED", "EnvGroup", "Problem"]

# A problem an actor reports in place of a result: `Problem(RAISED, batch_index, where,
# what, traceback)` for an exception of an environment, `Problem(BAD_SHAPE, batch_index,
# where, shape, repr)` for an observation of the wrong shape; `where` is e.g. "pid 123 on
# node 10.0.0.2".
Problem = collections.namedtuple("Problem", "kind index where what text")


class EnvGroup:
    """Actor side: the environments `first .. first + count - 1` of the batch.

    Constructed by Ray in the actor's process; `build` makes the environments. Every method
    returns its result or, when an environment failed, a problem tuple (see above): the
    other environments of the group are still stepped.
    """

    def __init__(self, constructor, first, count):
        import ray

        self._constructor = constructor
        self._first = first
        self._count = count
        self._envs = []
        self._shape = None
        self._where = f"pid {os.getpid()} on node {ray.util.get_node_ip_address()}"
        self._node = ray.get_runtime_context().get_node_id()

    def build(self):
        """Builds the environments; returns `{"pid", "node", "where", "envs": [(observation
        space, action space, id) per environment]}` or a problem tuple."""
        described, failure = build_group(self._constructor, self._count, self._envs)
        if failure:
            j, what, text = failure
            return Problem(RAISED, self._first + j, self._where, what, text)
        self._shape = tuple(getattr(described[0][0], "shape", None) or ())
        return {"pid": os.getpid(), "node": self._node, "where": self._where,
                "envs": described}

    def step(self, actions):
        """Steps each environment with its row of `actions`; returns `(observ, reward,
        terminated, truncated)` arrays of the group, or a problem tuple."""
        actions = np.array(actions)  # Writable, and the environments' own.
        reward = np.zeros(self._count, np.float32)
        terminated = np.zeros(self._count, bool)
        truncated = np.zeros(self._count, bool)

        def step(j):
            observ, reward[j], terminated[j], truncated[j], _ = self._envs[j].step(actions[j])
            return observ

        observ, problem = self._each(range(self._count), "step()", step)
        return problem or (observ, reward, terminated, truncated)

    def reset(self, local_indices, seed):
        """Resets the environments `local_indices` (of the group, ascending), environment
        `i` of the batch with seed `seed + i`; returns their observations float32
        `[len(local_indices), *shape]`, or a problem tuple."""

        def reset(j):
            return self._envs[j].reset(seed=None if seed is None else seed + self._first + j)[0]

        observ, problem = self._each(local_indices, "reset()", reset)
        return problem or observ

    def _each(self, local_indices, what, call):
        """Calls `call(j)`, which returns an observation, for each local index; returns the
        observations float32 `[len(local_indices), *shape]` and the most important problem
        (an exception first, then the lowest index; None if there is none)."""
        observ = np.zeros((len(local_indices), *self._shape), np.float32)
        problem = None
        for row, j in enumerate(local_indices):
            try:
                value = call(j)
                if np.shape(value) != self._shape:
                    problem = problem or Problem(BAD_SHAPE, self._first + j, self._where,
                                                  np.shape(value), repr(value))
                    continue
                observ[row] = value
            except Exception:
                if problem is None or problem.kind != RAISED:
                    problem = Problem(RAISED, self._first + j, self._where, what,
                                       traceback.format_exc())
        return observ, problem

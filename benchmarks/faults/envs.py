"""Environments that fail on purpose, for `python -m benchmarks.faults`
(`env: benchmarks.faults.envs:FaultyPendulum`).

`FaultyPendulum(fault, after)` is Pendulum-v1 (with its 200-step time limit) whose worker
misbehaves at its `after`-th step: `raise` (an exception), `exit` (`os._exit(3)`), `kill`
(SIGKILL to itself), `hang` (sleeps for an hour), `nan` (a NaN observation), or `none`.
Two faults are not at a step: `raise-init` raises in the constructor, and `raise-reset`
raises in the `after`-th call of `reset` (the first call is the one when the batch is
built, so `after` > 1 fails mid-run).

With `once=PATH`, a fault at a step happens only in the first environment to reach it
across all processes (the one that creates the file PATH): a worker restarted after the
fault (`env_backend: ray`, `worker_restarts`) runs on without it.
"""

import os
import signal
import time

import gymnasium as gym
import numpy as np

FAULTS = ("none", "raise", "exit", "kill", "hang", "nan", "raise-init", "raise-reset")
STEP_FAULTS = ("raise", "exit", "kill", "hang", "nan")


class FaultyPendulum(gym.Wrapper):

    def __init__(self, fault="none", after=100, render_mode=None, once=None):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choices: {', '.join(FAULTS)}")
        if fault == "raise-init":
            raise RuntimeError("injected fault in the constructor")
        super().__init__(gym.make("Pendulum-v1", render_mode=render_mode))
        self._fault = fault
        self._after = after
        self._count = 0
        self._resets = 0
        self._once = once

    def reset(self, **kwargs):
        self._resets += 1
        if self._fault == "raise-reset" and self._resets == self._after:
            raise RuntimeError(f"injected fault in reset call {self._resets}")
        return self.env.reset(**kwargs)

    def step(self, action):
        observ, reward, terminated, truncated, info = self.env.step(action)
        self._count += 1
        if self._count == self._after and self._fault in STEP_FAULTS and self._first():
            if self._fault == "raise":
                raise RuntimeError(f"injected fault after {self._count} steps")
            if self._fault == "exit":
                os._exit(3)
            if self._fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self._fault == "hang":
                time.sleep(3600)
            if self._fault == "nan":
                observ = np.full_like(observ, np.nan)
        return observ, reward, terminated, truncated, info

    def _first(self):
        """Whether this environment may fault: always, or with `once` only if it is the
        first to claim the file."""
        if self._once is None:
            return True
        try:
            os.close(os.open(self._once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

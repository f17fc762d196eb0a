"""An environment whose observations become NaN after a number of steps (for tests)."""

import numpy as np

from batchrl.environments.mock import MockEnvironment


class NanAfterSteps(MockEnvironment):
    def __init__(self, steps, render_mode=None):
        super().__init__((3,), (1,), 200, 200)
        self._nan_after = steps
        self._total = 0

    def step(self, action):
        observ, reward, terminated, truncated, info = super().step(action)
        self._total += 1
        if self._total >= self._nan_after:
            observ = np.full_like(observ, np.nan)
        return observ, reward, terminated, truncated, info

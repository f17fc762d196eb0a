"""`RecordingEnvironment`: a `MockEnvironment` that keeps what it returns, so that tests
can check what an algorithm stored against what the environment really gave."""

import numpy as np

from batchrl.environments.mock import MockEnvironment


class RecordingEnvironment(MockEnvironment):
    """A `MockEnvironment` (same arguments) that appends every observation it returns
    (from `reset` and `step`) to `observations` and every reward (float32) to `rewards`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.observations, self.rewards = [], []

    def reset(self, *, seed=None, options=None):
        observ, info = super().reset(seed=seed, options=options)
        self.observations.append(observ)
        return observ, info

    def step(self, action):
        observ, reward, terminated, truncated, info = super().step(action)
        self.observations.append(observ)
        self.rewards.append(np.float32(reward))
        return observ, reward, terminated, truncated, info

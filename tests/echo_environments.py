"""Environments that return the action they received as their observation, so that tests
can see which action reached the environment, in any process (`module:Class` ids for
`batchrl.environments.create`, also in worker processes and Ray actors)."""

import gymnasium as gym
import numpy as np


class EchoAction(gym.Env):
    """Observation: the last action received, as float32 `[size]` (zeros after `reset`);
    reward 0; never ends (give it a time limit).

    Args:
      action_space: the action space; `step` raises for an action outside it, as a strict
        environment does.
    """

    metadata = {"render_modes": []}

    def __init__(self, action_space):
        self.action_space = action_space
        size = int(np.prod(action_space.shape))
        self.observation_space = gym.spaces.Box(-100.0, 100.0, (size,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        observ = np.clip(np.asarray(action, np.float32).reshape(-1), -100.0, 100.0)
        return observ, 0.0, False, False, {}


class EchoOffsetDiscrete(EchoAction):
    """`EchoAction` of `Discrete(n, start)` (default `Discrete(3, start=1)`)."""

    def __init__(self, n=3, start=1):
        super().__init__(gym.spaces.Discrete(n, start=start))


class EchoUnboundedBox(EchoAction):
    """`EchoAction` of `Box(-inf, inf, (2,))`."""

    def __init__(self):
        super().__init__(gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))

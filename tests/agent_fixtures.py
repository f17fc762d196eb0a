"""What the `batchrl.Agent` tests share: small settings, spaces, and a deterministic feed
of observations, rewards and episode ends."""

import numpy as np
from gymnasium import spaces

from batchrl.agent import Agent

SMALL = {"policy_layers": [16], "value_layers": [16], "update_every": 4, "update_epochs": 2,
         "max_length": 10}
OBSERVATION = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTION = spaces.Box(np.array([0.0, -2.0], np.float32), np.array([1.0, 2.0], np.float32))


def make_agent(num_envs=3, observation_space=OBSERVATION, action_space=ACTION, config=SMALL,
           **overrides):
    return Agent.create(dict(config), observation_space, action_space, num_envs=num_envs,
                        **overrides)


class Feed:
    """Deterministic observations, rewards and episode ends of `num_envs` environments whose
    episodes last 3, 4, 5, ... steps (environment i: 3 + i), the last one truncated."""

    def __init__(self, num_envs, observ_shape=(3,), seed=0):
        self._random = np.random.default_rng(seed)
        self._shape = observ_shape
        self._steps = np.zeros(num_envs, int)
        self._durations = 3 + np.arange(num_envs)

    def observation(self):
        return self._random.normal(size=(len(self._steps),) + self._shape).astype(np.float32)

    def step(self):
        self._steps += 1
        ended = self._steps >= self._durations
        self._steps[ended] = 0
        truncated = ended & (np.arange(len(ended)) == len(ended) - 1)
        reward = self._random.normal(size=len(ended)).astype(np.float32)
        return reward, ended & ~truncated, truncated


def play(agent, feed, steps):
    for _ in range(steps):
        agent.act(feed.observation())
        agent.observe(*feed.step(), final_observation=feed.observation())

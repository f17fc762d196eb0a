"""A task that only a policy with memory solves, for tests and benchmarks of recurrent
policies (`env: batchrl.environments.memory_tasks:CueRecall`; free of TensorFlow)."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CueRecall(gym.Env):
    """Remember a cue shown once and name it at the episode's end.

    An episode lasts `length` steps. Its first observation shows a cue `c`, uniform in
    `{0, ..., cues - 1}`, one-hot in the first `cues` elements; the later observations
    show none (zeros), and the last element of the observation is 1 at the last step only
    (when to recall). The action is `Discrete(cues)`; the reward is 0 at every step but
    the last, where it is +1 when the action is `c` and -1 otherwise, and the episode
    terminates. A policy that remembers the cue scores 1; one that does not (a
    feed-forward policy, or a recurrent one that learned no memory) scores at most
    `2 / cues - 1` in expectation (0 for two cues). As T-maze tasks (Bakker, "Reinforcement
    Learning with Long Short-Term Memory", NIPS 2001) test memory over a gap.

    Args:
      cues: int >= 2, the number of cues (and actions).
      length: int >= 2, the steps of an episode: the cue must be kept `length - 1` steps.
    """

    def __init__(self, cues=2, length=16):
        if int(cues) < 2 or int(length) < 2:
            raise ValueError(f"CueRecall needs cues >= 2 and length >= 2, got {cues} and "
                             f"{length}")
        self.cues, self.length = int(cues), int(length)
        self.observation_space = spaces.Box(0.0, 1.0, (self.cues + 1,), np.float32)
        self.action_space = spaces.Discrete(self.cues)
        self._cue = 0
        self._step = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(self.cues))
        self._step = 0
        return self._observation(), {}

    def step(self, action):
        if self._step >= self.length:
            raise RuntimeError("CueRecall: step after the episode's end; call reset")
        recall = self._step == self.length - 1
        reward = (1.0 if int(action) == self._cue else -1.0) if recall else 0.0
        self._step += 1
        return self._observation(), reward, recall, False, {}

    def _observation(self):
        """The cue at the first step, the recall flag at the last (zeros after it)."""
        observation = np.zeros(self.cues + 1, np.float32)
        if self._step == 0:
            observation[self._cue] = 1.0
        observation[-1] = float(self._step == self.length - 1)
        return observation

"""A Gymnasium environment with random observations and episodes of random length."""

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["MockEnvironment"]


class MockEnvironment(gymnasium.Env):
    """Random observations and rewards; episodes last a random number of steps.

    The length of each episode is drawn uniformly from `[min_duration, max_duration]` with
    `self.np_random` when the episode is reset, so `reset(seed=...)` makes the episode
    (length, observations, rewards) repeatable. The last step of an episode returns
    `terminated=True` (or `truncated=True` with `truncate=True`).

    Observations are float32 arrays of shape `observ_shape` uniform in [-1, 1) (uint8
    arrays uniform in [0, 255] with `observ_dtype=np.uint8`, as images); rewards are Python
    floats uniform in [-1, 1).

    Attributes:
      steps: list of int, the number of steps taken in each episode so far (one entry per
        reset, the last one for the current episode).
      durations: list of int, the planned length in steps of each episode.

    Args:
      observ_shape: tuple of int, the observation shape.
      action_shape: tuple of int, the action shape.
      min_duration: int >= 1, the shortest episode length in steps.
      max_duration: int >= min_duration, the longest episode length in steps.
      truncate: end episodes with `truncated=True` instead of `terminated=True`.
      observ_dtype: `np.float32` or `np.uint8`.
      num_actions: None for a `Box` action space of `action_shape`, or n for `Discrete(n)`
        (then `action_shape` must be `()`).

    Raises:
      ValueError: `min_duration < 1` or `max_duration < min_duration`; another
        `observ_dtype`; `num_actions` with a non-empty `action_shape`.
    """

    metadata = {"render_modes": []}

    def __init__(self, observ_shape, action_shape, min_duration, max_duration, truncate=False,
                 observ_dtype=np.float32, num_actions=None):
        if int(min_duration) < 1 or int(max_duration) < int(min_duration):
            raise ValueError(
                f"need 1 <= min_duration <= max_duration, got min_duration={min_duration}, "
                f"max_duration={max_duration}"
            )
        self._observ_shape = tuple(observ_shape)
        self._action_shape = tuple(action_shape)
        self._min_duration = int(min_duration)
        self._max_duration = int(max_duration)
        self._truncate = bool(truncate)
        if np.dtype(observ_dtype) == np.uint8:
            self.observation_space = spaces.Box(0, 255, self._observ_shape, np.uint8)
        elif np.dtype(observ_dtype) == np.float32:
            self.observation_space = spaces.Box(-1.0, 1.0, self._observ_shape, np.float32)
        else:
            raise ValueError(f"observ_dtype must be float32 or uint8, got {observ_dtype}")
        if num_actions is None:
            self.action_space = spaces.Box(-1.0, 1.0, self._action_shape, np.float32)
        elif self._action_shape:
            raise ValueError(f"num_actions needs action_shape (), got {self._action_shape}")
        else:
            self.action_space = spaces.Discrete(int(num_actions))
        self.render_mode = None
        self.steps = []
        self.durations = []

    def reset(self, *, seed=None, options=None):
        """Starts a new episode of random length.

        Returns:
          `(observation, info)`: float32 `observ_shape` array and an empty dict.
        """
        super().reset(seed=seed)
        duration = int(self.np_random.integers(self._min_duration, self._max_duration + 1))
        self.steps.append(0)
        self.durations.append(duration)
        return self._observation(), {}

    def step(self, action):
        """Takes one step of the current episode.

        Args:
          action: array-like of shape `action_shape` (its values are not used).

        Returns:
          `(observation, reward, terminated, truncated, info)`: float32 `observ_shape` array,
          float, bool, bool (one of them True on the episode's last step) and an empty dict.

        Raises:
          ValueError: the action does not have shape `action_shape`.
          RuntimeError: no episode was started (no reset yet) or the episode already ended.
        """
        action_shape = np.shape(action)
        if action_shape != self._action_shape:
            raise ValueError(
                f"expected an action of shape {self._action_shape}, got {action_shape}"
            )
        if not self.steps:
            raise RuntimeError("step() called before reset()")
        if self.steps[-1] >= self.durations[-1]:
            raise RuntimeError(
                f"step() called after the episode ended (after {self.steps[-1]} steps); "
                "call reset() first"
            )
        self.steps[-1] += 1
        done = self.steps[-1] >= self.durations[-1]
        terminated = done and not self._truncate
        truncated = done and self._truncate
        reward = float(self.np_random.uniform(-1.0, 1.0))
        return self._observation(), reward, terminated, truncated, {}

    def _observation(self):
        if self.observation_space.dtype == np.uint8:
            return self.np_random.integers(0, 256, self._observ_shape, dtype=np.uint8)
        return self.np_random.uniform(-1.0, 1.0, self._observ_shape).astype(np.float32)

"""Small Gymnasium tasks with nested spaces, for tests and benchmarks of `Dict` observations
and actions (`env: batchrl.environments.nested_tasks:NAME`; free of TensorFlow)."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.pendulum import PendulumEnv


class DictPendulum(PendulumEnv):
    """Gymnasium's Pendulum (`PendulumEnv`, the environment of Pendulum-v1) with its
    observation split into a `Dict`: `{"angle": [cos(theta), sin(theta)], "velocity":
    [theta_dot]}` (float32; bounds [-1, 1] and [-8, 8] rad/s). Flattened
    (`gymnasium.spaces.flatten`, keys in sorted order) it is Pendulum's own observation
    `[cos, sin, theta_dot]`. Actions, rewards and rendering are Pendulum's; like
    `PendulumEnv` it has no time limit of its own (Pendulum-v1's is 200 steps: set
    `max_length: 200`).

    Args:
      render_mode, g: as for `PendulumEnv`.
    """

    def __init__(self, render_mode=None, g=10.0):
        super().__init__(render_mode=render_mode, g=g)
        self.observation_space = spaces.Dict({
            "angle": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "velocity": spaces.Box(-8.0, 8.0, (1,), np.float32),
        })

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return self._split(observation), info

    def step(self, action):
        observation, *rest = super().step(action)
        return self._split(observation), *rest

    @staticmethod
    def _split(observation):
        return {"angle": observation[:2], "velocity": observation[2:]}


class ReachAndChoose(gym.Env):
    """A contextual bandit in episodes, with a `Dict` observation and a `Dict` action of a
    `Box` and a `Discrete` leaf: reach a point and choose the cued kind.

    Each step shows a target `t` uniform in [-1, 1]^2 and a cue `c` uniform in {0, 1, 2}:
    observation `{"cue": c, "target": t}`. The action `{"kind": k, "move": m}` has
    `k` in `Discrete(3, start=1)` and `m` in `Box(-2, 2, (2,))`; the reward is
    `[k == c + 1] - mean((m - 2 t)^2)`: at most 1 per step (the right kind, `m = 2 t`); a
    uniformly random action earns about 1/3 - 8/3 = -2.3 on average. Episodes never
    terminate; give them a time limit (`max_length`). `render_mode="rgb_array"` draws the
    target (white), the move (yellow) and whether the kind was right (green / red border).

    Args:
      render_mode: None or "rgb_array".
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None):
        self.observation_space = spaces.Dict({
            "cue": spaces.Discrete(3),
            "target": spaces.Box(-1.0, 1.0, (2,), np.float32),
        })
        self.action_space = spaces.Dict({
            "kind": spaces.Discrete(3, start=1),
            "move": spaces.Box(-2.0, 2.0, (2,), np.float32),
        })
        self.render_mode = render_mode
        self._observation = None
        self._last = None  # The last action and whether its kind was right, for rendering.

    def _observe(self):
        self._observation = {
            "cue": int(self.np_random.integers(3)),
            "target": self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32),
        }
        return self._observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._last = None
        return self._observe(), {}

    def step(self, action):
        right = int(action["kind"]) == self._observation["cue"] + 1
        error = np.mean(np.square(np.asarray(action["move"]) - 2.0 * self._observation["target"]))
        self._last = (self._observation["target"], np.asarray(action["move"]), right)
        return self._observe(), float(right) - float(error), False, False, {"right_kind": right}

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        size = 64
        frame = np.zeros((size, size, 3), np.uint8)
        if self._last is None:
            return frame
        target, move, right = self._last
        frame[:3], frame[-3:], frame[:, :3], frame[:, -3:] = (
            [(0, 200, 0) if right else (200, 0, 0)] * 4)
        for point, color in ((2.0 * target, (255, 255, 255)), (move, (255, 220, 0))):
            column, row = ((np.clip(point, -2.0, 2.0) + 2.0) / 4.0 * (size - 9) + 4).astype(int)
            frame[size - 1 - row - 1:size - row + 1, column - 1:column + 2] = color
        return frame


class MaskedChoice(gym.Env):
    """Choose the most valuable of the actions a mask allows: a test task of action masking.

    Each step shows `n` values `v` uniform in [0, 1] and a mask `m` of the actions that may
    be taken (each allowed with probability 1/2, at least one): observation
    `{"action_mask": m, "values": v}` (`MultiBinary(n)`, `Box(0, 1, (n,))`). The action is
    an index in `Discrete(n)`; its reward is `v[a]`, at most 1. Taking a forbidden action
    raises `ValueError`, so that a run which completes took none; `masked_actions` counts
    them when `strict` is False (reward -1). Choosing uniformly among the allowed actions
    earns 0.5 a step, always taking the best allowed one about 0.73 (n = 5). Episodes never
    terminate; give them a time limit (`max_length`).

    Args:
      n: the number of actions.
      strict: raise on a forbidden action, else count it.
    """

    metadata = {"render_modes": []}

    def __init__(self, n=5, strict=True):
        self.observation_space = spaces.Dict({
            "action_mask": spaces.MultiBinary(n),
            "values": spaces.Box(0.0, 1.0, (n,), np.float32)})
        self.action_space = spaces.Discrete(n)
        self._n = n
        self._strict = strict
        self.masked_actions = 0
        self._observation = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        action = int(action)
        if not self._observation["action_mask"][action]:
            if self._strict:
                raise ValueError(f"action {action} is masked out by "
                                 f"{self._observation['action_mask'].tolist()}")
            self.masked_actions += 1
            reward = -1.0
        else:
            reward = float(self._observation["values"][action])
        return self._draw(), reward, False, False, {}

    def _draw(self):
        mask = (self.np_random.random(self._n) < 0.5).astype(np.int8)
        mask[self.np_random.integers(self._n)] = 1
        values = self.np_random.random(self._n).astype(np.float32)
        self._observation = {"action_mask": mask, "values": values}
        return self._observation


class ImageAndCue(gym.Env):
    """A multimodal test task: the reward needs both an image and a vector entry of the
    observation, so that it is learned only by a network that reads both.

    Each step shows an 8 x 8 grayscale image (uint8, `[8, 8, 1]`) that is dark but for one
    bright pixel at a random place, and a cue `c` in {-1, 1} (`Box(-1, 1, (1,))`):
    observation `{"cue": c, "image": image}`. The action is a side in `Discrete(2)`; the
    reward is 1 when it is the bright pixel's side (0: its column < 4, else 1) for c = 1,
    or the other side for c = -1, else 0. Each entry alone tells nothing about the right
    side: 0.5 a step, 10 per 20-step episode; both: 20. With `blank`, that entry is always
    zero (the rewards unchanged), for the test that the task needs it. Episodes never
    terminate; give them a time limit (`max_length`).

    Args:
      blank: None, `"image"` or `"cue"`.
    """

    metadata = {"render_modes": []}

    def __init__(self, blank=None):
        if blank not in (None, "image", "cue"):
            raise ValueError(f"blank must be None, 'image' or 'cue', got {blank!r}")
        self.observation_space = spaces.Dict({
            "cue": spaces.Box(-1.0, 1.0, (1,), np.float32),
            "image": spaces.Box(0, 255, (8, 8, 1), np.uint8)})
        self.action_space = spaces.Discrete(2)
        self._blank = blank
        self._answer = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        reward = float(int(action) == self._answer)
        return self._draw(), reward, False, False, {}

    def _draw(self):
        row, column = self.np_random.integers(8, size=2)
        cue = self.np_random.choice([-1.0, 1.0])
        side = int(column >= 4)
        self._answer = side if cue > 0 else 1 - side
        image = np.zeros((8, 8, 1), np.uint8)
        image[row, column] = 255
        observation = {"cue": np.array([cue], np.float32), "image": image}
        if self._blank is not None:
            observation[self._blank] = np.zeros_like(observation[self._blank])
        return observation

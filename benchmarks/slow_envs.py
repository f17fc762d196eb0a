"""Environments that cost a set CPU time per step, for benchmarks (benchmarks/ray_scaling.py).

`SlowPendulum(step_us)` is Pendulum-v1 (with its 200-step time limit) that also keeps its
process busy for `step_us` microseconds of wall-clock time at every step, as a large
simulator would: a busy loop, not a sleep, so that it takes a core and parallel stepping
gains only as many cores as there are.
"""

import time

import gymnasium as gym


class SlowPendulum(gym.Wrapper):

    def __init__(self, step_us=1000.0, render_mode=None):
        super().__init__(gym.make("Pendulum-v1", render_mode=render_mode))
        self._step_ns = int(float(step_us) * 1000)

    def step(self, action):
        end = time.perf_counter_ns() + self._step_ns
        while time.perf_counter_ns() < end:
            pass
        return self.env.step(action)

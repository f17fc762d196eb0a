"""The inverted pendulum swing-up as TensorFlow graph operations."""

import math

import numpy as np
import tensorflow as tf
from gymnasium import spaces

from batchrl.environments.native.base import NativeBatchEnv, compute_once

# Constants of Gymnasium's `PendulumEnv` (classic_control/pendulum.py), SI units.
_MAX_SPEED = 8.0  # rad/s, the angular velocity is clipped to [-8, 8].
_MAX_TORQUE = 2.0  # N m.
_DT = 0.05  # s, the time step.
_MASS = 1.0  # kg.
_LENGTH = 1.0  # m.
_INIT_ANGLE = math.pi  # rad, initial angle uniform in [-pi, pi).
_INIT_SPEED = 1.0  # rad/s, initial angular velocity uniform in [-1, 1).


class Pendulum(NativeBatchEnv):
    """A batch of Gymnasium's `Pendulum-v1` swing-up tasks, stepped in the graph.

    The dynamics, reward, limits and initial-state distribution are those of Gymnasium's
    `PendulumEnv` (gymnasium/envs/classic_control/pendulum.py, v1), with the time limit
    and the action rescaling of `batchrl.environments.create("Pendulum-v1")`:

    - state `[theta, theta_dot]`, float64: the angle in rad (0 is upright, positive
      counter-clockwise, not wrapped) and the angular velocity in rad/s;
    - action float32 `[B, 1]` in [-1, 1]: clipped to [-1, 1], then mapped linearly to the
      torque `u = 2 * action` in N m (in [-2, 2]);
    - reward `-(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)`, with `normalize`
      wrapping the angle of the state *before* the step into [-pi, pi); it lies in
      [-16.2736044, 0];
    - dynamics, with `dt = 0.05` s, `m = l = 1`:
      `theta_dot' = clip(theta_dot + (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt, -8, 8)`,
      `theta' = theta + theta_dot' dt`;
    - observation float32 `[cos(theta), sin(theta), theta_dot]`;
    - initial state: theta uniform in [-pi, pi), theta_dot uniform in [-1, 1);
    - never terminates; truncated after `max_episode_steps` steps.

    The arithmetic follows Gymnasium's NumPy dtypes step by step (float32 torque terms,
    float64 state), so that trajectories agree to rounding of `sin` and `cos`.

    Args:
      num_envs: int >= 1, the batch size `B`.
      max_episode_steps: int >= 1, the time limit in steps (Gymnasium registers 200).
      seed: int, seed of the random generator of the initial states.
      g: float, the acceleration of gravity in m/s^2 (Gymnasium's default 10.0).

    Raises:
      ValueError: `num_envs` or `max_episode_steps` is not a positive int.
    """

    gymnasium_id = "Pendulum-v1"
    state_size = 2

    def __init__(self, num_envs, max_episode_steps=200, seed=0, g=10.0):
        self._g = float(g)
        high = np.array([1.0, 1.0, _MAX_SPEED], np.float32)
        super().__init__(
            num_envs, max_episode_steps, seed,
            observation_space=spaces.Box(-high, high, dtype=np.float32),
            # Rescaled to [-1, 1] as by `create` (its `standard_wrappers`).
            action_space=spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32))

    @property
    def g(self):
        """The acceleration of gravity in m/s^2 (float)."""
        return self._g

    def simulate(self, action):
        """Applies the torques and steps every pendulum once (see the class docstring).

        Args:
          action: float32 tensor `[B, 1]`, the torque scaled to [-1, 1] (clipped to it).

        Returns:
          bool tensor `[B]`, the new `done` (the time limit), available once all
          variables are assigned.

        Raises:
          ValueError: an action whose static shape is not `[B, 1]`.
          TypeError or ValueError: an action tensor of another dtype than float32.
          tf.errors.InvalidArgumentError (when run): an action whose shape, unknown when
            tracing, turns out to be wrong.
        """
        return super().simulate(action)

    def _initial_state(self, count):
        high = tf.constant([_INIT_ANGLE, _INIT_SPEED], tf.float64)
        unit = self._random.uniform([count, 2], dtype=tf.float64)
        return -high + 2.0 * high * unit

    def _transition(self, state, action):
        theta, theta_dot = state[:, 0], state[:, 1]
        # As `create`: ClipAction to [-1, 1], then RescaleAction to [-2, 2] (exact in
        # float32), then the environment's own clip.
        torque = tf.clip_by_value(action[:, 0], -1.0, 1.0) * _MAX_TORQUE
        torque = tf.clip_by_value(torque, -_MAX_TORQUE, _MAX_TORQUE)
        # Gymnasium multiplies the float32 torque by Python floats, which NumPy does in
        # float32 before adding the float64 terms; so do these products.
        torque_cost = tf.cast(0.001 * tf.square(torque), tf.float64)
        torque_accel = tf.cast(3.0 / (_MASS * _LENGTH**2) * torque, tf.float64)
        cost = tf.square(_normalize_angle(theta)) + 0.1 * tf.square(theta_dot) + torque_cost
        gravity_accel = 3 * self._g / (2 * _LENGTH) * tf.sin(theta)
        new_theta_dot = theta_dot + (gravity_accel + torque_accel) * _DT
        new_theta_dot = compute_once(tf.clip_by_value(new_theta_dot, -_MAX_SPEED, _MAX_SPEED))
        new_theta = theta + new_theta_dot * _DT
        new_state = tf.stack([new_theta, new_theta_dot], axis=1)
        terminated = tf.zeros_like(theta, tf.bool)
        return new_state, -cost, terminated

    def _observe(self, state):
        theta, theta_dot = state[:, 0], state[:, 1]
        observ = tf.stack([tf.cos(theta), tf.sin(theta), theta_dot], axis=1)
        return tf.cast(observ, tf.float32)


def _normalize_angle(angle):
    """The angle in rad wrapped into [-pi, pi), as Gymnasium's `angle_normalize`."""
    return tf.math.floormod(angle + math.pi, 2 * math.pi) - math.pi

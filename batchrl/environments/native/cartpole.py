"""The cart-pole balancing task as TensorFlow graph operations."""

import math

import numpy as np
import tensorflow as tf
from gymnasium import spaces

from batchrl.environments.native.base import NativeBatchEnv, compute_once

# Constants of Gymnasium's `CartPoleEnv` (classic_control/cartpole.py), SI units.
_GRAVITY = 9.8  # m/s^2.
_MASS_CART = 1.0  # kg.
_MASS_POLE = 0.1  # kg.
_TOTAL_MASS = _MASS_POLE + _MASS_CART
_HALF_LENGTH = 0.5  # m, half the pole's length.
_POLEMASS_LENGTH = _MASS_POLE * _HALF_LENGTH
_FORCE = 10.0  # N.
_TAU = 0.02  # s, the time step.
_X_THRESHOLD = 2.4  # m.
_THETA_THRESHOLD = 12 * 2 * math.pi / 360  # rad, 12 degrees.
_INIT_BOUND = 0.05  # Every state variable starts uniform in [-0.05, 0.05).


class CartPole(NativeBatchEnv):
    """A batch of Gymnasium's `CartPole-v1` balancing tasks, stepped in the graph.

    The cart-pole of Barto, Sutton & Anderson, "Neuronlike adaptive elements that can
    solve difficult learning control problems" (1983), with the dynamics, reward,
    termination and initial-state distribution of Gymnasium's `CartPoleEnv`
    (gymnasium/envs/classic_control/cartpole.py, Euler integrator, default reward):

    - state `[x, x_dot, theta, theta_dot]`, float64: the cart position in m, its velocity
      in m/s, the pole angle in rad (0 is upright) and its angular velocity in rad/s;
    - action int32 `[B]`: 1 pushes the cart right with 10 N, anything else (0) left. Values
      outside {0, 1} are not rejected (a check in the graph would keep XLA from compiling
      the step), unlike Gymnasium, which asserts;
    - dynamics with `g = 9.8` m/s^2, cart 1 kg, pole 0.1 kg of half length 0.5 m:
      `temp = (F + m_p l theta_dot^2 sin(theta)) / (m_c + m_p)`,
      `theta_acc = (g sin(theta) - cos(theta) temp) / (l (4/3 - m_p cos(theta)^2 / (m_c +
      m_p)))`, `x_acc = temp - m_p l theta_acc cos(theta) / (m_c + m_p)`, then one
      explicit Euler step of 0.02 s (positions with the old velocities);
    - reward 1.0 at every step, including the terminating one;
    - terminated when, after the step, `|x| > 2.4` m or `|theta| > 12` degrees;
    - observation `float32(state)`;
    - initial state: each variable uniform in [-0.05, 0.05);
    - truncated after `max_episode_steps` steps.

    Args:
      num_envs: int >= 1, the batch size `B`.
      max_episode_steps: int >= 1, the time limit in steps (Gymnasium registers 500).
      seed: int, seed of the random generator of the initial states.

    Raises:
      ValueError: `num_envs` or `max_episode_steps` is not a positive int.
    """

    gymnasium_id = "CartPole-v1"
    state_size = 4

    def __init__(self, num_envs, max_episode_steps=500, seed=0):
        # Twice the termination limits, so that a final observation still lies inside.
        high = np.array(
            [2 * _X_THRESHOLD, np.inf, 2 * _THETA_THRESHOLD, np.inf], np.float32)
        super().__init__(
            num_envs, max_episode_steps, seed,
            observation_space=spaces.Box(-high, high, dtype=np.float32),
            action_space=spaces.Discrete(2))

    def simulate(self, action):
        """Pushes every cart and steps it once (see the class docstring).

        Args:
          action: int32 tensor `[B]`, 1 to push right, 0 to push left.

        Returns:
          bool tensor `[B]`, the new `done` (the pole fell, the cart left the track or the
          time limit), available once all variables are assigned.

        Raises:
          ValueError: an action whose static shape is not `[B]`.
          TypeError or ValueError: an action tensor of another dtype than int32.
          tf.errors.InvalidArgumentError (when run): an action whose shape, unknown when
            tracing, turns out to be wrong.
        """
        return super().simulate(action)

    def _initial_state(self, count):
        return self._random.uniform(
            [count, 4], -_INIT_BOUND, _INIT_BOUND, dtype=tf.float64)

    def _transition(self, state, action):
        x, x_dot, theta, theta_dot = tf.unstack(state, axis=1)
        force = tf.where(tf.equal(action, 1), _FORCE, -_FORCE)
        force = tf.cast(force, tf.float64)
        cos, sin = compute_once(tf.cos(theta)), compute_once(tf.sin(theta))
        # The same order of operations as Gymnasium, so that rounding agrees.
        temp = (force + _POLEMASS_LENGTH * tf.square(theta_dot) * sin) / _TOTAL_MASS
        theta_acc = (_GRAVITY * sin - cos * temp) / (
            _HALF_LENGTH * (4.0 / 3.0 - _MASS_POLE * tf.square(cos) / _TOTAL_MASS))
        x_acc = temp - _POLEMASS_LENGTH * theta_acc * cos / _TOTAL_MASS
        x = x + _TAU * x_dot
        x_dot = x_dot + _TAU * x_acc
        theta = theta + _TAU * theta_dot
        theta_dot = theta_dot + _TAU * theta_acc
        new_state = tf.stack([x, x_dot, theta, theta_dot], axis=1)
        terminated = tf.logical_or(
            tf.logical_or(x < -_X_THRESHOLD, x > _X_THRESHOLD),
            tf.logical_or(theta < -_THETA_THRESHOLD, theta > _THETA_THRESHOLD))
        reward = tf.ones_like(x)
        return new_state, reward, terminated

    def _observe(self, state):
        return tf.cast(state, tf.float32)

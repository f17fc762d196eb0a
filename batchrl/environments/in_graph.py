"""A batch of Python environments exposed to TensorFlow as graph operations."""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl.environments.numpy_function import (
    keep_python_thread_state,
    skip_needless_output_conversions,
)
from batchrl.spaces.graph import observation_dtype


class BatchVariables:
    """The variables that hold the current step of a batch of `batch` environments with the
    given spaces, as `InGraphBatchEnv` documents them (`observ`, `action`, `reward`, `done`,
    `terminated`; `done` starts all True).

    Raises:
      ValueError: for an observation space that is not a `Box` or an action space that is
        neither a `Box` nor a `Discrete`.
    """

    def __init__(self, batch, observation_space, action_space):
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"unsupported observation space {observation_space}: need a Box")
        if isinstance(action_space, gym.spaces.Box):
            action_shape, action_dtype = tuple(action_space.shape), tf.float32
        elif isinstance(action_space, gym.spaces.Discrete):
            action_shape, action_dtype = (), tf.int32
        else:
            raise ValueError(
                f"unsupported action space {action_space}: need a Box or a Discrete")
        self.observ_shape = tuple(observation_space.shape)
        self.observ_dtype = observation_dtype(observation_space)
        with tf.name_scope("environment"):
            self.observ = tf.Variable(
                tf.zeros((batch,) + self.observ_shape, self.observ_dtype), trainable=False,
                name="observ")
            self.action = tf.Variable(
                tf.zeros((batch,) + action_shape, action_dtype), trainable=False, name="action")
            self.reward = tf.Variable(tf.zeros([batch], tf.float32), trainable=False,
                                      name="reward")
            self.done = tf.Variable(tf.ones([batch], tf.bool), trainable=False, name="done")
            self.terminated = tf.Variable(tf.zeros([batch], tf.bool), trainable=False,
                                          name="terminated")


class BatchVariablesView:
    """The properties `observ`, `action`, `reward`, `done` and `terminated` of an in-graph
    batch (`InGraphBatchEnv` documents them): the variables of the `BatchVariables` the
    batch passed to `_hold`, which its methods assign."""

    def _hold(self, variables):
        self._observ, self._action = variables.observ, variables.action
        self._reward, self._done = variables.reward, variables.done
        self._terminated = variables.terminated

    @property
    def observ(self):
        return self._observ

    @property
    def action(self):
        return self._action

    @property
    def reward(self):
        return self._reward

    @property
    def done(self):
        return self._done

    @property
    def terminated(self):
        return self._terminated


class WrappingView(BatchVariablesView):
    """A `BatchVariablesView` around the batch `self._batch_env`: `len()`, `[i]` and other
    attributes (not private ones) reach it."""

    def __len__(self):
        return len(self._batch_env)

    def __getitem__(self, index):
        return self._batch_env[index]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._batch_env, name)


class InGraphBatchEnv(WrappingView):
    """Steps and resets a `BatchEnv` from inside a `tf.function`.

    The current batch lives in non-trainable variables, all with a leading batch dimension
    `B = len(batch_env)`:

    - `observ`: `[B, *observation_shape]`, the latest observation of each agent (after an
      episode ended, its final observation until the agent is reset): uint8 for a uint8
      or bool observation space (`observation_dtype`), float32 for any other;
    - `action`: the latest action, float32 `[B, *action_shape]` for a `Box` action space,
      int32 `[B]` for `Discrete`;
    - `reward`: float32 `[B]`, the reward of the latest step;
    - `done`: bool `[B]`, the latest step ended the episode (terminated or truncated).
      It starts as all True, so the first `simulate` call begins an episode for every agent;
    - `terminated`: bool `[B]`, the latest step ended the episode in a terminal state (the
      value of the next state is zero); `done & ~terminated` means truncated (time limit);
    - `interrupted`: bool `[B]`, the latest step cut the episode short because the batch
      restarted the worker of that environment (then `done` is True too); the variable
      exists only when the batch environment reports this (its attribute `interrupted` is
      not None, as for a `RayBatchEnv` with restarts), else the property is None.

    The Python environments are called through `tf.numpy_function`; constructing one
    makes such calls cheaper for the whole process
    (`batchrl.environments.numpy_function.skip_needless_output_conversions`). `len()`, `[i]` and
    other attributes reach the wrapped `BatchEnv`.

    Args:
      batch_env: a `BatchEnv` (or anything with its interface).

    Raises:
      ValueError: for an observation space that is not a `Box` or an action space that is
        neither a `Box` nor a `Discrete`.
    """

    def __init__(self, batch_env):
        skip_needless_output_conversions()
        self._batch_env = batch_env
        self._error = None
        batch = len(batch_env)
        variables = BatchVariables(batch, batch_env.observation_space, batch_env.action_space)
        self._observ_shape = variables.observ_shape
        self._observ_dtype = variables.observ_dtype.as_numpy_dtype
        self._hold(variables)
        self._interrupted = None
        if getattr(batch_env, "interrupted", None) is not None:
            with tf.name_scope("environment"):
                self._interrupted = tf.Variable(tf.zeros([batch], tf.bool), trainable=False,
                                                name="interrupted")
        # What `BatchEnv.step` returns: observation, reward, terminated, truncated.
        self._step_shapes = ((batch,) + self._observ_shape, (batch,), (batch,), (batch,))

    @property
    def interrupted(self):
        return self._interrupted

    def simulate(self, action):
        """Steps every environment once and stores the results in the variables.

        Args:
          action: tensor `[B, *action_shape]` (float32 for Box, int32 for Discrete actions).

        Returns:
          bool tensor `[B]`, the new `done`, available once all variables are assigned.

        Raises:
          tf.errors.InvalidArgumentError (when run): for an action of the wrong shape, and
            for whatever the environments raise (e.g. a NaN observation, a crashed worker).
        """
        action = tf.convert_to_tensor(action, self._action.dtype)
        if not action.shape.is_fully_defined():  # Else checked when tracing, for free.
            action = tf.ensure_shape(action, self._action.shape)
        elif action.shape != self._action.shape:
            raise ValueError(f"action of shape {action.shape}, expected {self._action.shape}")
        observ, scalars = tf.numpy_function(
            self._step, [action], [self._observ.dtype, tf.float32], name="step")
        # `_step` returns exactly these shapes (it checks them): declared, not checked again
        # at run time.
        batch = len(self)
        observ.set_shape((batch,) + self._observ_shape)
        scalars.set_shape([batch, 3 if self._interrupted is None else 4])
        reward, terminated, done, *interrupted = tf.unstack(scalars, axis=1)
        done = tf.cast(done, tf.bool)
        terminated = tf.cast(terminated, tf.bool)
        assigns = [
            self._observ.assign(observ),
            self._action.assign(action),
            self._reward.assign(reward),
            self._done.assign(done),
            self._terminated.assign(terminated),
        ]
        if interrupted:
            assigns.append(self._interrupted.assign(tf.cast(interrupted[0], tf.bool)))
        with tf.control_dependencies(assigns):
            return tf.identity(done)

    def reset(self, indices=None):
        """Resets the environments at the given batch indices.

        Their `reward` becomes 0 and their `done`, `terminated` (and `interrupted`) flags
        False.

        Args:
          indices: int32 tensor `[n]` of batch indices, or None for all.

        Returns:
          tensor `[n, *observation_shape]` of the dtype of `observ`, the new observations,
          available once the variables are assigned.
        """
        if indices is None:
            indices = tf.range(len(self))
        indices = tf.cast(indices, tf.int32)
        observ = tf.numpy_function(self._reset, [indices], self._observ.dtype, name="reset")
        observ = tf.ensure_shape(observ, (None,) + self._observ_shape)
        count = tf.shape(indices)[0]
        assigns = [
            self._observ.scatter_nd_update(indices[:, None], observ),
            self._reward.scatter_nd_update(indices[:, None], tf.zeros([count], tf.float32)),
            self._done.scatter_nd_update(indices[:, None], tf.zeros([count], tf.bool)),
            self._terminated.scatter_nd_update(indices[:, None], tf.zeros([count], tf.bool)),
        ]
        if self._interrupted is not None:
            assigns.append(self._interrupted.scatter_nd_update(
                indices[:, None], tf.zeros([count], tf.bool)))
        with tf.control_dependencies(assigns):
            return tf.identity(observ)

    @property
    def error(self):
        """The last exception an environment call inside the graph raised, or None.

        `tf.numpy_function` turns such exceptions into `tf.errors.OpError`s with the
        traceback in the message; this keeps the original (e.g. a `WorkerError` naming the
        environment) for callers that want to re-raise it.
        """
        return self._error

    def _step(self, action):
        """Steps the batch; returns the observation `[B, *observation_shape]` (the dtype of
        `observ`) and
        float32 `[B, 3]` holding the reward, terminated and done (terminated or truncated)
        columns, the flags 0 or 1 (`[B, 4]` with the batch's `interrupted` flags as a fourth
        column when they are tracked).

        Packing the reward and flags into one array saves work on every step: each output
        of a `tf.numpy_function` is converted to a tensor on its own, and bool outputs are
        the slowest. `done` is computed here, where it costs less than a graph op.
        """
        keep_python_thread_state()
        try:
            observ, reward, terminated, truncated, _ = self._batch_env.step(action)
        except Exception as error:
            self._error = error
            raise
        observ = np.asarray(observ, self._observ_dtype)
        shapes = (observ.shape, np.shape(reward), np.shape(terminated), np.shape(truncated))
        if shapes != self._step_shapes:  # The graph declares these shapes without checking.
            names = ("observation", "reward", "terminated", "truncated")
            for name, shape, expected in zip(names, shapes, self._step_shapes, strict=True):
                if shape != expected:
                    self._error = ValueError(
                        f"the batch environment returned a {name} of shape {shape}, "
                        f"expected {expected}")
                    raise self._error
        scalars = np.empty((len(observ), 3 if self._interrupted is None else 4), np.float32)
        scalars[:, 0] = reward
        scalars[:, 1] = terminated
        scalars[:, 2] = np.logical_or(terminated, truncated)
        if self._interrupted is not None:
            scalars[:, 3] = self._batch_env.interrupted
            np.maximum(scalars[:, 2], scalars[:, 3], out=scalars[:, 2])  # Cut short: done.
        return observ, scalars

    def _reset(self, indices):
        keep_python_thread_state()
        try:
            observ, _ = self._batch_env.reset(indices.tolist())
        except Exception as error:
            self._error = error
            raise
        return np.asarray(observ, self._observ_dtype)

"""Shared machinery of the in-graph native environments: variables, time limit, resets."""

import tensorflow as tf

from batchrl.environments.in_graph import BatchVariables, BatchVariablesView


class NativeBatchEnv(BatchVariablesView):
    """A batch of environments whose dynamics are TensorFlow graph operations.

    Subclasses implement one physical system (`_initial_state`, `_transition`, `_observe`,
    `state_size`, `gymnasium_id`) and pass its spaces to the constructor; this class keeps
    the batch in non-trainable variables and does the bookkeeping common to all of them, so
    that the whole step is made of graph ops (no `tf.numpy_function`, no Python per step)
    and can be compiled with XLA (`tf.function(jit_compile=True)`). `simulate` and `reset`
    work eagerly, inside a `tf.function` (with or without `jit_compile`) and inside a
    `tf.while_loop` body.

    It duck-types `batchrl.tools.InGraphBatchEnv`: the same variables, all with a leading
    batch dimension `B = num_envs` and created in the constructor (outside any trace):

    - `observ`: float32 `[B, *observation_shape]`, the latest observation of each
      environment (after an episode ended, its final observation until it is reset);
      zero before the first reset;
    - `action`: the latest action, float32 `[B, *action_shape]` for a `Box` action space,
      int32 `[B]` for `Discrete`;
    - `reward`: float32 `[B]`, the reward of the latest step;
    - `done`: bool `[B]`, the latest step ended the episode (terminated or truncated). It
      starts as all True, so the first `simulate` of `batchrl.drivers.simulate` resets all;
    - `terminated`: bool `[B]`, the latest step ended the episode in a terminal state;
      `done & ~terminated` means truncated by the time limit;

    and in addition:

    - `state`: float64 `[B, state_size]`, the physical state (Gymnasium integrates in
      float64; keeping it avoids drifting away from its trajectories); zero before the
      first reset;
    - `elapsed_steps`: int32 `[B]`, the steps taken in the current episode. A step that
      brings it to `max_episode_steps` truncates the episode (like Gymnasium's `TimeLimit`).

    `observation_space` and `action_space` (attributes) are the Gymnasium spaces of one
    environment, equal to those of `batchrl.environments.create(gymnasium_id)`;
    `gymnasium_id` (class attribute) names the equivalent Gymnasium environment (e.g. to
    render videos).

    Random initial states come from a `tf.random.Generator` seeded with `seed` and owned by
    the environment (the same distribution as Gymnasium's, not the same numbers).

    Args:
      num_envs: int >= 1, the batch size `B`.
      max_episode_steps: int >= 1, the time limit in steps.
      seed: int, seed of the random generator of the initial states.
      observation_space: `gymnasium.spaces.Box`, float32, of one environment.
      action_space: `gymnasium.spaces.Box` (float32 actions) or `Discrete` (int32 actions)
        of one environment.

    Raises:
      ValueError: `num_envs` or `max_episode_steps` is not a positive int.
    """

    in_graph = True  # Tells `batchrl.environments` not to wrap it in a BatchEnv.
    gymnasium_id = None  # Set by subclasses, e.g. "Pendulum-v1".
    state_size = None  # Set by subclasses: the number of state variables.

    def __init__(self, num_envs, max_episode_steps, seed, observation_space, action_space):
        self.observation_space = observation_space
        self.action_space = action_space
        self._num_envs = _positive_int(num_envs, "num_envs")
        self._max_episode_steps = _positive_int(max_episode_steps, "max_episode_steps")
        batch = self._num_envs
        with tf.init_scope():  # Variables are created once, outside of any trace.
            self._random = tf.random.Generator.from_seed(int(seed))
            self._hold(BatchVariables(batch, observation_space, action_space))
            with tf.name_scope("environment"):
                self._state = tf.Variable(
                    tf.zeros([batch, self.state_size], tf.float64), trainable=False,
                    name="state")
                self._elapsed_steps = tf.Variable(
                    tf.zeros([batch], tf.int32), trainable=False, name="elapsed_steps")

    def __len__(self):
        return self._num_envs

    def __repr__(self):
        return (f"{type(self).__name__}(num_envs={self._num_envs}, "
                f"max_episode_steps={self._max_episode_steps})")

    @property
    def num_envs(self):
        """The batch size `B` (int)."""
        return self._num_envs

    @property
    def max_episode_steps(self):
        """The time limit in steps (int)."""
        return self._max_episode_steps

    @property
    def state(self):
        return self._state

    @property
    def elapsed_steps(self):
        return self._elapsed_steps

    @property
    def error(self):
        """Always None: the dynamics run in the graph, no Python environment can fail."""
        return None

    def close(self):
        """Does nothing (nothing to release); for the interface of `InGraphBatchEnv`."""

    def simulate(self, action):
        """Steps every environment once and stores the results in the variables.

        All environments are stepped, also those whose episode has ended (their physics
        simply goes on); reset them to begin a new episode.

        Args:
          action: tensor `[B, *action_shape]`, float32 for a Box and int32 for a Discrete
            action space (see the subclass for the meaning).

        Returns:
          bool tensor `[B]`, the new `done` (`terminated | truncated`), available once all
          variables are assigned.

        Raises:
          ValueError: an action whose static shape is not `[B, *action_shape]`.
          TypeError or ValueError: an action tensor of another dtype (e.g. float64); NumPy
            arrays are converted (cast) like `tf.convert_to_tensor` does.
          tf.errors.InvalidArgumentError (when run): an action whose shape, unknown when
            tracing, turns out to be wrong.
        """
        action = tf.convert_to_tensor(action, self._action.dtype)
        if not action.shape.is_compatible_with(self._action.shape):
            raise ValueError(
                f"{type(self).__name__}.simulate: action of shape {action.shape}, expected "
                f"{self._action.shape} ({self._num_envs} environments)")
        action = tf.ensure_shape(action, self._action.shape)
        state, reward, terminated = self._transition(self._state.read_value(), action)
        observ = self._observe(state)
        elapsed_steps = self._elapsed_steps.read_value() + 1
        truncated = elapsed_steps >= self._max_episode_steps
        done = tf.logical_or(terminated, truncated)
        assigns = [
            self._state.assign(state),
            self._elapsed_steps.assign(elapsed_steps),
            self._observ.assign(observ),
            self._action.assign(action),
            self._reward.assign(tf.cast(reward, tf.float32)),
            self._done.assign(done),
            self._terminated.assign(terminated),
        ]
        with tf.control_dependencies(assigns):
            return tf.identity(done)

    def reset(self, indices=None):
        """Begins new episodes at the given batch indices, from random initial states.

        Their `reward` and `elapsed_steps` become 0 and their `done` and `terminated`
        flags False; the other environments are left untouched. Duplicate indices reset
        their environment once.

        The random states are drawn for the whole batch and selected with a mask, so that
        every shape is static (as XLA prefers): a call costs the same whatever the number
        of indices.

        Args:
          indices: int32 tensor `[n]` of batch indices, or None for all.

        Returns:
          float32 tensor `[n, *observation_shape]`, the new observations, available once
          the variables are assigned.

        Raises:
          tf.errors.InvalidArgumentError (when run): an index outside `[0, B)` (not
            checked under XLA, which ignores such indices).
        """
        batch = self._num_envs
        fresh = self._initial_state(batch)
        if indices is None:
            state = fresh
            mask = tf.ones([batch], tf.bool)
        else:
            indices = tf.cast(indices, tf.int32)
            mask = tf.scatter_nd(indices[:, None], tf.ones_like(indices), [batch]) > 0
            state = tf.where(mask[:, None], fresh, self._state.read_value())
        observ = self._observe(state)
        zero = tf.zeros([batch], tf.int32)
        assigns = [
            self._state.assign(state),
            self._observ.assign(observ),
            self._elapsed_steps.assign(tf.where(mask, zero, self._elapsed_steps)),
            self._reward.assign(tf.where(mask, tf.cast(zero, tf.float32), self._reward)),
            self._done.assign(tf.logical_and(self._done, ~mask)),
            self._terminated.assign(tf.logical_and(self._terminated, ~mask)),
        ]
        if indices is not None:
            observ = tf.gather(observ, indices)
        with tf.control_dependencies(assigns):
            return tf.identity(observ)

    def set_state(self, indices, state):
        """Places the environments at the given indices into the given physical states.

        Also sets their `observ` to the observation of that state. Nothing else changes
        (`elapsed_steps`, `done`, `reward`...): `reset` them first to begin an episode.
        Useful in tests and to follow a Gymnasium environment's trajectory (copy its
        `unwrapped.state`).

        Args:
          indices: int32 tensor `[n]` of batch indices.
          state: float64 tensor `[n, state_size]` (anything convertible; float32 values
            are widened), in the units of the subclass's state.

        Returns:
          float32 tensor `[n, *observation_shape]`, the observations of those states,
          available once the variables are assigned.

        Raises:
          ValueError: a state whose static shape is not `[n, state_size]`.
          tf.errors.InvalidArgumentError (when run): an index outside `[0, B)`.
        """
        indices = tf.cast(indices, tf.int32)
        state = tf.cast(tf.convert_to_tensor(state), tf.float64)
        if not state.shape.is_compatible_with([None, self.state_size]):
            raise ValueError(
                f"{type(self).__name__}.set_state: state of shape {state.shape}, expected "
                f"[n, {self.state_size}]")
        observ = self._observe(state)
        assigns = [
            self._state.scatter_nd_update(indices[:, None], state),
            self._observ.scatter_nd_update(indices[:, None], observ),
        ]
        with tf.control_dependencies(assigns):
            return tf.identity(observ)

    # To implement in subclasses.

    def _initial_state(self, count):
        """float64 `[count, state_size]` random initial states (uses `self._random`)."""
        raise NotImplementedError

    def _transition(self, state, action):
        """One step: `(next_state float64 [B, state_size], reward [B], terminated bool [B])`
        from `state` float64 `[B, state_size]` and `action` (shape and dtype checked)."""
        raise NotImplementedError

    def _observe(self, state):
        """float32 `[n, *observation_shape]`, the observations of float64 `state`."""
        raise NotImplementedError


def _positive_int(value, name):
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def compute_once(value):
    """`value` itself (a tensor with a leading batch dimension), computed only once by XLA.

    XLA's CPU fusion copies an elementwise producer into every fusion that consumes it,
    and a fused concatenation (`tf.stack` of state columns) evaluates it again for each
    column: an expensive value such as `sin(theta)` would be evaluated up to seven times
    per step. A gather by `range(B)` is an identity that fusion does not see through, so
    the value is computed once into a buffer; outside XLA it is a cheap copy. Exact.
    """
    return tf.gather(value, tf.range(tf.shape(value)[0]))

"""The batch-environment contract, checked in one place for every backend (no TensorFlow).

`BaseBatchEnv` is to batchrl's batch environments what TF-Agents' `PyEnvironment` is to its
environments: the public `step` and `reset` check the caller's arguments once, call the
backend's `_step` and `_reset`, and check what the backend returns, so that `BatchEnv`,
`ParallelBatchEnv`, `EnvPoolBatchEnv` and `RayBatchEnv` refuse the same mistakes with the
same messages (DESIGN.md, Environments).
"""

import numpy as np
from gymnasium import spaces

__all__ = ["BaseBatchEnv", "fixed_shape"]


class BaseBatchEnv:
    """`B` environments with equal spaces, stepped and reset together.

    A backend calls `_init_contract(num_envs, observation_space, action_space)` once it
    knows its spaces, and implements:

    - `_step(actions)`: steps every environment once with validated actions (an array of
      shape `[B, *action_shape]`, of a dtype that converts to the action space's dtype
      under NumPy's `same_kind` rule, each row within the action space as below); returns
      `(observ, reward, terminated, truncated, infos)` with observ float32 (uint8 for
      a uint8 observation space) `[B, *observation_shape]`, reward float32 `[B]`,
      terminated and truncated bool `[B]`, and a sequence of `B` dicts;
    - `_reset(indices, seed)`: resets the environments at `indices` (a non-empty int64
      array `[n]` of distinct batch indices in `[0, B)`, in the caller's order; all of them
      for `reset()`), environment `i` with seed `seed + i` when `seed` is an int; returns
      `(observ, infos)`, observ float32 (or uint8) `[n, *observation_shape]` in the order
      of `indices`;
    - `close()` and the `blocking` property;
    - optionally `_on_error(error, indices)`, what a non-finite result does (see there), and
      `_env_name(index)`, how error messages name an environment.

    Checked here: the action shape; the action dtype; `Discrete` / `MultiDiscrete` /
    `MultiBinary` actions within the space (integers: a float action such as 0.9 for
    `Discrete` is refused, not truncated); `Box` actions finite (their range is left to
    the environments: batchrl's wrappers and `EnvPoolBatchEnv` clip to [-1, 1]); reset
    indices 1-D integers, in range, distinct; observations and rewards finite. A mistake
    of the caller raises before any environment is touched and leaves the batch usable.
    """

    def _init_contract(self, num_envs, observation_space, action_space):
        """Records the spaces and precomputes the checks (called by the backend's `__init__`).

        Raises:
          ValueError: a space has no fixed shape, or the action space's dtype is not numeric.
        """
        self._num_envs = int(num_envs)
        self._observation_space = observation_space
        self._action_space = action_space
        self._observ_shape = fixed_shape(observation_space, "observation")
        self._action_batch_shape = (self._num_envs, *fixed_shape(action_space, "action"))
        self._action_dtype = np.dtype(getattr(action_space, "dtype", None) or np.float32)
        if self._action_dtype.kind not in "biuf":
            raise ValueError(f"unsupported action space {action_space!r}: its dtype is not "
                             "numeric")
        self._action_bounds = _integer_bounds(action_space)
        self._all_indices = np.arange(self._num_envs)

    def _check_spaces(self, described, first=0):
        """Raises ValueError unless every entry of `described` (a sequence of
        `(observation_space, action_space, ...)`, environment `first + k` at `k`) has the
        spaces of `_init_contract`; the message names the index and both spaces."""
        for index, (observation_space, action_space, *_) in enumerate(described, first):
            for what, space, reference in (
                    ("observation", observation_space, self._observation_space),
                    ("action", action_space, self._action_space)):
                if space != reference:
                    raise ValueError(f"{what} space of env {index} ({space!r}) differs from "
                                     f"that of env 0 ({reference!r})")

    # Public interface.

    def __len__(self):
        """The batch size `B`."""
        return self._num_envs

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    @property
    def observation_space(self):
        """The observation space shared by all environments (of a single environment)."""
        return self._observation_space

    @property
    def action_space(self):
        """The action space shared by all environments (of a single environment)."""
        return self._action_space

    @property
    def blocking(self):
        """Whether the environments are stepped one after the other (bool)."""
        raise NotImplementedError

    def close(self):
        """Closes the environments and frees what the backend holds."""
        raise NotImplementedError

    def step(self, actions):
        """Steps all environments once.

        Args:
          actions: array-like `[B, *action_shape]`, one action per environment (`[B]`
            integers for a `Discrete` action space), of a dtype that converts to the action
            space's dtype under NumPy's `same_kind` rule (ints to float32 do, floats to the
            int64 of `Discrete` do not).

        Returns:
          `(observ, reward, terminated, truncated, infos)`: observ float32
          `[B, *observation_shape]`, reward float32 `[B]`, terminated bool `[B]`, truncated
          bool `[B]` (the time limit), infos a sequence of `B` dicts. The step that ends an
          episode returns its final observation; the environment must be reset before it
          is stepped again.

        Raises:
          ValueError: `actions` has the wrong shape or dtype, an action is outside a
            `Discrete` / `MultiDiscrete` / `MultiBinary` space or is NaN or infinite for a
            `Box` (naming the environment; nothing was stepped and the batch stays usable);
            or an environment returned a NaN or infinite observation or reward (naming the
            environment and the value).
          Further errors of the backend (see its class): e.g. `WorkerError` for a failed
            worker process.
        """
        actions = self._check_actions(actions)
        observ, reward, terminated, truncated, infos = self._step(actions)
        if not (np.isfinite(observ).all() and np.isfinite(reward).all()):
            self._non_finite(observ, reward, self._all_indices)
        return observ, reward, terminated, truncated, infos

    def reset(self, indices=None, seed=None):
        """Resets the environments at the given batch indices, and only those.

        Args:
          indices: sequence or 1-D integer array of distinct batch indices; all
            environments if None. An empty sequence resets nothing.
          seed: optional int; environment `i` (a batch index) is then reset with seed
            `seed + i`.

        Returns:
          `(observ, infos)`: observ float32 `[len(indices), *observation_shape]`, infos a
          sequence of `len(indices)` dicts, in the order of `indices`.

        Raises:
          IndexError: an index is out of range (negative indices are not allowed).
          ValueError: `indices` is not a 1-D sequence of integers, or an index appears
            twice (nothing was reset); or an environment returned a NaN or infinite
            observation (naming the environment and the value).
          Further errors of the backend (see its class).
        """
        indices = self._check_indices(indices)
        if not len(indices):
            return np.zeros((0, *self._observ_shape), np.float32), ()
        observ, infos = self._reset(indices, None if seed is None else int(seed))
        if not np.isfinite(observ).all():
            self._non_finite(observ, None, indices)
        return observ, infos

    # The backend's part.

    def _step(self, actions):
        raise NotImplementedError

    def _reset(self, indices, seed):
        raise NotImplementedError

    def _on_error(self, error, indices):
        """Called with the ValueError for non-finite results and the batch indices (int
        array) of the environments that returned them; must raise. By default raises
        `error`; a backend may first close the batch or mark those environments."""
        raise error

    def _env_name(self, index):
        """How error messages name environment `index` (str)."""
        return f"env {index}"

    # Checks.

    def _check_actions(self, actions):
        """`actions` as an array, checked (see `step`); raises ValueError."""
        actions = np.asarray(actions)
        if actions.shape != self._action_batch_shape:
            raise ValueError(
                f"expected actions of shape {self._action_batch_shape} (batch size "
                f"{self._num_envs}, action shape {self._action_space.shape}), "
                f"got shape {actions.shape}")
        if actions.dtype != self._action_dtype and not np.can_cast(
                actions.dtype, self._action_dtype, "same_kind"):
            raise ValueError(
                f"expected actions convertible to {self._action_dtype} (the action space's "
                f"dtype), got dtype {actions.dtype}")
        if self._action_bounds is None:  # A Box: finite values.
            if not np.isfinite(actions).all():
                row = _first_bad_row(~np.isfinite(actions))
                raise ValueError(f"{self._env_name(row)} was given a non-finite action: "
                                 f"{actions[row].tolist()}")
            return actions
        low, high = self._action_bounds
        outside = (actions < low) | (actions > high)
        if outside.any():
            row = _first_bad_row(outside)
            raise ValueError(f"{self._env_name(row)} was given the action "
                             f"{actions[row].tolist()}, outside the action space "
                             f"{self._action_space}")
        return actions

    def _check_indices(self, indices):
        """`indices` as an int64 array `[n]` (all for None), checked (see `reset`)."""
        if indices is None:
            return self._all_indices
        array = np.asarray(indices)
        if array.size == 0 and array.ndim == 1:
            return np.zeros(0, np.int64)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ValueError(f"indices must be a 1-D sequence of integers (batch indices), "
                             f"got {indices!r}")
        outside = (array < 0) | (array >= self._num_envs)
        if outside.any():
            raise IndexError(f"batch index {int(array[outside][0])} out of range for a "
                             f"batch of {self._num_envs}")
        ordered = np.sort(array)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(repeated):
            raise ValueError(f"batch index {int(repeated[0])} appears more than once in the "
                             f"indices to reset: {array.tolist()}")
        return array.astype(np.int64, copy=False)

    def _non_finite(self, observ, reward, indices):
        """Calls `_on_error` for the first environment (in batch order of `indices`) with a
        non-finite observation, else for the first with a non-finite reward."""
        bad_observ = ~np.isfinite(observ.reshape(len(observ), -1)).all(axis=1)
        if bad_observ.any():
            row = int(np.flatnonzero(bad_observ)[0])
            what = f"observation: {observ[row]!r}"
        else:
            row = int(np.flatnonzero(~np.isfinite(reward))[0])
            what = f"reward: {float(reward[row])!r}"
        bad = bad_observ if reward is None else bad_observ | ~np.isfinite(reward)
        self._on_error(
            ValueError(f"{self._env_name(int(indices[row]))} returned a non-finite {what}"),
            np.asarray(indices)[bad])


def fixed_shape(space, what):
    """`space.shape` (tuple of int); raises ValueError naming `what` if it has none."""
    shape = getattr(space, "shape", None)
    if not isinstance(shape, tuple) or not all(isinstance(n, int) for n in shape):
        raise ValueError(f"unsupported {what} space {space!r}: it has no fixed shape")
    return shape


def _integer_bounds(space):
    """For a `Discrete`, `MultiDiscrete` or `MultiBinary` space `(low, high)`, the smallest
    and largest allowed value (ints, or int arrays of the space's shape for
    `MultiDiscrete`); None for other spaces."""
    if isinstance(space, spaces.Discrete):
        return int(space.start), int(space.start + space.n - 1)
    if isinstance(space, spaces.MultiDiscrete):
        return space.start, space.start + space.nvec - 1
    if isinstance(space, spaces.MultiBinary):
        return 0, 1
    return None


def _first_bad_row(bad):
    """The first row (int) of the bool array `bad` `[B, ...]` holding a True."""
    return int(np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))[0])

"""A batch of EnvPool environments (C++ threads) behind the `BatchEnv` contract."""

import collections.abc
import contextlib
import difflib
import os
import warnings

import numpy as np
from gymnasium import spaces

__all__ = ["EnvPoolBatchEnv", "check_task_id", "task_ids"]


def task_ids():
    """Every task id EnvPool knows (list of str); imports EnvPool."""
    import envpool

    return list(envpool.list_all_envs())


def check_task_id(task_id):
    """Raises ValueError for a task id EnvPool does not have, naming close matches."""
    known = task_ids()
    if task_id in known:
        return
    close = difflib.get_close_matches(task_id, known, n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ValueError(f"EnvPool has no task {task_id!r}{hint}")


def episode_limit(task_id):
    """EnvPool's default episode length limit of a task (int steps)."""
    import envpool

    return int(envpool.make_spec(task_id).config.max_episode_steps)


class _Infos(collections.abc.Sequence):
    """The per-environment info dicts of a call, a sequence as long as the batch, built
    from EnvPool's dict of batched arrays only when an element is read."""

    def __init__(self, info, order, count):
        self._info = info
        self._order = np.arange(count)[order]

    def __len__(self):
        return len(self._order)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        row = int(self._order[index])
        return {key: value[row] for key, value in self._info.items()
                if isinstance(value, np.ndarray) and len(value) > row}


class EnvPoolBatchEnv:
    """`num_envs` environments of one EnvPool task, stepped by EnvPool's C++ thread pool
    (synchronous mode: every call steps or resets the given environments and returns when
    all are done), with the interface and guarantees of `BatchEnv`:

    - no hidden auto-reset: an environment whose episode ended must be reset with
      `reset(indices)` before it is stepped again (EnvPool would otherwise replace its next
      step by a reset); stepping it raises RuntimeError instead;
    - `terminated` and `truncated` (the time limit) come apart, and the step that ends an
      episode returns the episode's final observation;
    - observations are float32 (a `Dict` observation of a DeepMind Control task is
      flattened: its arrays concatenated in key order); a `Box` action space with finite
      bounds is declared as `Box(-1, 1)`, and actions are clipped to it and mapped linearly
      onto the task's bounds (as `batchrl.tools.wrappers.standard_wrappers` does);
    - NaN or infinite observations and rewards raise ValueError naming the environment.

    EnvPool seeds environment `i` with `seed + i` when it builds the pool; `reset(seed=s)`
    builds the pool again with seed `s` (only for all environments at once).

    Args:
      task_id: an EnvPool task id, e.g. "HalfCheetah-v5", "CheetahRun-v1"
        (`envpool.list_all_envs()`).
      num_envs: int >= 1, the batch size `B`.
      num_threads: EnvPool's worker threads; None: `os.cpu_count()`.
      seed: int, the seed of environment 0.
      max_episode_steps: the episode length limit; None: the task's own.
      kwargs: dict of further keyword arguments of `envpool.make_gymnasium`.

    Raises:
      ValueError: an unknown task id (naming close matches), `num_envs` < 1, or an
        observation or action space this contract does not support.
    """

    def __init__(self, task_id, num_envs, num_threads=None, seed=0, max_episode_steps=None,
                 kwargs=None):
        check_task_id(task_id)
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self._task_id = task_id
        self._num_envs = int(num_envs)
        self._options = dict(kwargs or {})
        self._options["num_threads"] = int(num_threads or os.cpu_count() or 1)
        if max_episode_steps:
            self._options["max_episode_steps"] = int(max_episode_steps)
        self._pool = None
        self._build(int(seed))
        self._observation_space, self._keys = _observation_space(self._pool_spaces[0])
        self._action_space, self._action_low, self._action_high = _action_space(
            self._pool_spaces[1])
        self._action_shape = (self._num_envs, *self._action_space.shape)
        self._all = np.arange(self._num_envs, dtype=np.int32)

    def _build(self, seed):
        import envpool

        if self._pool is not None:
            self._pool.close()
        with _quiet_spaces():
            self._pool = envpool.make_gymnasium(
                self._task_id, num_envs=self._num_envs, batch_size=self._num_envs,
                seed=seed, **self._options)
            # Built once and kept by the pool, which reads them in every step.
            self._pool_spaces = self._pool.observation_space, self._pool.action_space
        self._seed = seed
        self._fresh = True  # Built with `seed`, not yet reset or stepped.
        # True: the episode ended (or never began); the environment must be reset.
        self._done = np.ones(self._num_envs, bool)

    def __len__(self):
        """The batch size `B`."""
        return self._num_envs

    def __getitem__(self, index):
        raise TypeError("an EnvPool batch has no per-environment objects; use the batch's "
                        "step and reset with indices")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def task_id(self):
        """The EnvPool task id (str)."""
        return self._task_id

    @property
    def observation_space(self):
        """The observation space of one environment: a float32 `Box`."""
        return self._observation_space

    @property
    def action_space(self):
        """The action space of one environment: `Box(-1, 1)` or `Discrete`."""
        return self._action_space

    @property
    def blocking(self):
        """True: every call returns once EnvPool has stepped or reset the environments."""
        return True

    def step(self, actions):
        """Steps all environments once.

        Args:
          actions: array-like `[B, *action_shape]` (`[B]` integers for `Discrete`).

        Returns:
          `(observ, reward, terminated, truncated, infos)` as `BatchEnv.step`: float32
          `[B, *observation_shape]`, float32 `[B]`, bool `[B]`, bool `[B]`, and a sequence of
          `B` dicts (EnvPool's per-environment info values, built when read).

        Raises:
          ValueError: `actions` has the wrong shape, or a NaN or infinite observation or
            reward came back (naming the environment).
          RuntimeError: an environment's episode ended and it was not reset since (or it
            was never reset).
        """
        actions = np.asarray(actions)
        if actions.shape != self._action_shape:
            raise ValueError(
                f"expected actions of shape {self._action_shape} (batch size "
                f"{self._num_envs}, action shape {self._action_space.shape}), got shape "
                f"{actions.shape}")
        if self._done.any():
            index = int(np.flatnonzero(self._done)[0])
            raise RuntimeError(
                f"env {index} ({self._task_id}): its episode ended or never began; reset it "
                f"before stepping (EnvPool would reset it in place of this step)")
        if self._action_low is not None:
            actions = self._action_low + (np.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (
                self._action_high - self._action_low)
        self._fresh = False
        observ, reward, terminated, truncated, info = self._pool.step(actions, self._all)
        order = _order(info, self._all)
        observ = self._observ(observ, order, self._all)
        reward = np.asarray(reward, np.float32)[order]
        _check_finite("reward", reward, self._all, self._task_id)
        terminated = np.asarray(terminated, bool)[order]
        truncated = np.asarray(truncated, bool)[order]
        self._done = terminated | truncated
        return observ, reward, terminated, truncated, _Infos(info, order, self._num_envs)

    def reset(self, indices=None, seed=None):
        """Resets the environments at the given batch indices, and only those.

        Args:
          indices: sequence or 1-D integer array of batch indices; all if None.
          seed: optional int: environment `i` then begins from seed `seed + i`. EnvPool
            seeds when it builds the pool, so this builds it again, and `indices` must be
            None (or every index).

        Returns:
          `(observ, infos)`: float32 `[len(indices), *observation_shape]` and a sequence of
          `len(indices)` dicts, in the order of `indices`.

        Raises:
          IndexError: an index is out of range.
          ValueError: `seed` with only some of the indices; a NaN or infinite observation.
        """
        if indices is None:
            indices = self._all
        else:
            indices = np.asarray(indices, dtype=np.int64).reshape(-1)
            for index in indices:
                if not 0 <= index < self._num_envs:
                    raise IndexError(f"batch index {index} out of range for a batch of "
                                     f"{self._num_envs}")
            indices = indices.astype(np.int32)
        if seed is not None:
            if sorted(indices.tolist()) != self._all.tolist():
                raise ValueError(
                    f"EnvPool seeds its environments when it builds the pool: reset with a "
                    f"seed resets all {self._num_envs} environments, got indices "
                    f"{indices.tolist()}")
            if not (self._fresh and int(seed) == self._seed):
                self._build(int(seed))
        if not len(indices):
            return np.zeros((0, *self._observation_space.shape), np.float32), ()
        self._fresh = False
        observ, info = self._pool.reset(indices)
        order = _order(info, indices)
        observ = self._observ(observ, order, indices)
        self._done[indices] = False
        return observ, _Infos(info, order, len(indices))

    def close(self):
        """Stops EnvPool's threads; calling it again does nothing."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _observ(self, observ, order, indices):
        if self._keys is not None:
            observ = np.concatenate(
                [np.reshape(observ[key], (len(indices), -1)) for key in self._keys], axis=1)
        observ = np.asarray(observ, np.float32)[order]
        _check_finite("observation", observ, indices, self._task_id)
        return observ


@contextlib.contextmanager
def _quiet_spaces():
    """Hides Gymnasium's warnings about EnvPool's float64 space bounds cast to float32."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered")
        yield


def _order(info, indices):
    """The permutation that puts EnvPool's results in the order of `indices`."""
    env_id = np.asarray(info["env_id"])
    if np.array_equal(env_id, indices):
        return slice(None)
    position = {int(env): row for row, env in enumerate(env_id)}
    return np.array([position[int(index)] for index in indices])


def _check_finite(name, values, indices, task_id):
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"env {int(indices[row])} ({task_id}) returned a non-finite "
                         f"{name}: {values[row]!r}")


def _observation_space(space):
    """The float32 `Box` of EnvPool's observation space and, for a `Dict`, its keys in the
    order they are concatenated (None for a `Box`)."""
    if isinstance(space, spaces.Box):
        return spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                          space.shape, np.float32), None
    if isinstance(space, spaces.Dict) and all(
            isinstance(leaf, spaces.Box) for leaf in space.spaces.values()):
        keys = sorted(space.spaces)
        size = sum(int(np.prod(space.spaces[key].shape)) for key in keys)
        # DeepMind Control tasks declare no meaningful bounds.
        return spaces.Box(-np.inf, np.inf, (size,), np.float32), keys
    raise ValueError(f"unsupported EnvPool observation space {space!r}: only Box, or a Dict "
                     f"of Boxes, is supported")


def _action_space(space):
    """The declared action space and, for a `Box` with finite bounds, the task's bounds
    that -1 and 1 map to (None otherwise)."""
    if isinstance(space, spaces.Discrete):
        return space, None, None
    if isinstance(space, spaces.Box):
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        if np.isfinite(low).all() and np.isfinite(high).all():
            return spaces.Box(-1.0, 1.0, space.shape, np.float32), low, high
        return spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                          space.shape, np.float32), None, None
    raise ValueError(f"unsupported EnvPool action space {space!r}: only Box and Discrete "
                     f"are supported")

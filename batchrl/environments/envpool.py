"""A batch of EnvPool environments (C++ threads) behind the `BatchEnv` contract."""

import collections.abc
import contextlib
import difflib
import functools
import os
import warnings

import numpy as np
from gymnasium import spaces

from batchrl.environments.base import BaseBatchEnv

__all__ = ["EnvPoolBatchEnv", "check_task_id", "resolve_options", "task_ids", "task_spaces"]

# Options of `envpool.make_gymnasium` that `EnvPoolBatchEnv` sets itself, and why.
_MANAGED = {
    "num_envs": "it is the batch size (config key num_agents)",
    "batch_size": "batches are stepped synchronously",
    "seed": "environment i is seeded with seed + i (config key seed)",
    "env_seed": "environment i is seeded with seed + i (config key seed)",
    "gym_reset_return_info": "reset returns infos"}


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


@functools.cache
def _default_spec(task_id):
    """EnvPool's spec of a task with its default options (`envpool.make_spec`), made once
    per process: an Atari task's takes about 0.1 s (it reads the ROM), and a command asks
    for it several times (checking the config, building the algorithm and the batch).
    Raises what `make_spec` raises for an unknown task id (not cached)."""
    import envpool

    return envpool.make_spec(task_id)


def episode_limit(task_id):
    """EnvPool's default episode length limit of a task (int steps)."""
    return int(_default_spec(task_id).config.max_episode_steps)


def task_spaces(task_id, options=None):
    """The spaces of one environment of an EnvPool task, read from EnvPool's spec
    (`envpool.make_spec`; no environment is built).

    Args:
      task_id: an EnvPool task id, e.g. "Pong-v5" (`envpool.list_all_envs()`).
      options: dict of the task's options or None, as `resolve_options` returns them
        (checked); those that shape the observations (e.g. Atari's `stack_num`,
        `img_height`, `gray_scale`) change the spaces.

    Returns:
      `(observation_space, action_space, task_action_space)`: the first two as
      `EnvPoolBatchEnv` declares them (float32 observations, uint8 frames `[4, 84, 84]` for
      Atari, a `Dict` of a DeepMind Control task flattened; a bounded `Box` action as
      `Box(-1, 1)`), and the task's own action space (a bounded `Box` float32 with the
      task's bounds, onto which [-1, 1] is mapped; otherwise the declared one).

    Raises:
      ValueError: an unknown task id (naming close matches), or a space that
        `EnvPoolBatchEnv` does not support.
    """
    import envpool

    check_task_id(task_id)
    with _quiet_spaces():
        spec = (envpool.make_spec(task_id, **dict(options)) if options
                else _default_spec(task_id))
        observation_space, _ = _observation_space(spec.observation_space)
        action_space, low, high = _action_space(spec.action_space)
    if low is None:
        return observation_space, action_space, action_space
    task_action_space = spaces.Box(low.astype(np.float32), high.astype(np.float32),
                                   action_space.shape, np.float32)
    return observation_space, action_space, task_action_space


def resolve_options(task_id, num_threads, max_episode_steps, options):
    """The settings of an `EnvPoolBatchEnv` (see its arguments), from the arguments and the
    task options `options` (dict or None).

    Returns:
      `(num_threads, max_episode_steps, options)`: ints >= 1 (`num_threads` None when
      neither gives it; `max_episode_steps` the task's own when neither gives it), and a
      new dict of the other options.

    Raises:
      ValueError: the task has no option of that name (naming close matches), or
        `EnvPoolBatchEnv` sets it itself (naming the argument that does); `num_threads` or
        `max_episode_steps` not an int >= 1, or given as an argument and as an option with
        different values.
    """
    options = dict(options or {})
    known = [key for key in _default_spec(task_id).config._fields if key != "version"]
    for key in options:
        if key in _MANAGED:
            raise ValueError(f"EnvPool option {key!r} is batchrl's to set: {_MANAGED[key]}")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
            hint = f" (close matches: {', '.join(close)})" if close else ""
            raise ValueError(f"EnvPool task {task_id} has no option {key!r}{hint}; its "
                             f"options: {', '.join(sorted(set(known) - set(_MANAGED)))}")
    num_threads = _setting("num_threads", num_threads, options)
    max_episode_steps = _setting("max_episode_steps", max_episode_steps, options)
    return num_threads, max_episode_steps or episode_limit(task_id), options


def _setting(key, value, options):
    """The int >= 1 given as the argument `key` (`value`) or as the option `options[key]`
    (removed from `options`), or None; raises ValueError for a contradiction or a value
    that is not an int >= 1."""
    option = options.pop(key, None)
    for where, given in (("argument", value), ("option", option)):
        if given is not None and (isinstance(given, bool) or not isinstance(
                given, int | np.integer) or given < 1):
            raise ValueError(f"{key} ({where}) must be an int >= 1, got {given!r}")
    if value is not None and option is not None and int(value) != int(option):
        raise ValueError(f"{key} given twice: {value} as an argument and {option} as an "
                         f"EnvPool option")
    chosen = value if value is not None else option
    return None if chosen is None else int(chosen)


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


class EnvPoolBatchEnv(BaseBatchEnv):
    """`num_envs` environments of one EnvPool task, stepped by EnvPool's C++ thread pool
    (synchronous mode: every call steps or resets the given environments and returns when
    all are done), with the interface and guarantees of `BatchEnv` (`BaseBatchEnv`'s `step`
    and `reset` and their checks):

    - no hidden auto-reset: an environment whose episode ended must be reset with
      `reset(indices)` before it is stepped again (EnvPool would otherwise replace its next
      step by a reset); stepping it raises RuntimeError instead. An environment that
      returned a NaN or infinite value (ValueError) counts as ended too;
    - `terminated` and `truncated` (the time limit) come apart as in Gymnasium's
      `TimeLimit`: the step that reaches `max_episode_steps` is truncated, and terminated
      too when the task ends there (EnvPool itself would report it truncated only, so its
      own limit is set one step beyond, never reached, and the limit is applied here from
      its `elapsed_step`); the step that ends an episode returns the episode's final
      observation;
    - observations are float32 (a `Dict` observation of a DeepMind Control task is
      flattened: its arrays concatenated in key order), but for a uint8 `Box` (the frames
      of an Atari task, `[4, 84, 84]` by default), which stay uint8; a `Box` action space
      with finite bounds is declared as `Box(-1, 1)`, and actions are clipped to it and
      mapped linearly onto the task's bounds (as
      `batchrl.environments.wrappers.standard_wrappers` does);
    - NaN or infinite observations and rewards raise ValueError naming the environment.

    EnvPool seeds environment `i` with `seed + i` when it builds the pool; `reset(seed=s)`
    builds the pool again with seed `s` (only for all environments at once).

    Args:
      task_id: an EnvPool task id, e.g. "HalfCheetah-v5", "CheetahRun-v1"
        (`envpool.list_all_envs()`).
      num_envs: int >= 1, the batch size `B`.
      num_threads: EnvPool's worker threads (int >= 1); None: `kwargs["num_threads"]` if
        given, else `os.cpu_count()`.
      seed: int, the seed of environment 0.
      max_episode_steps: the episode length limit (int >= 1); None:
        `kwargs["max_episode_steps"]` if given, else the task's own.
      kwargs: dict of further options of the task (`envpool.make_spec(task_id).config`),
        passed to `envpool.make_gymnasium`.

    Raises:
      ValueError: an unknown task id (naming close matches), `num_envs` < 1, an invalid
        `num_threads` or `max_episode_steps`, an option in `kwargs` that the task does not
        have or that this class sets itself (`num_envs`, `batch_size`, `seed`, `env_seed`,
        `gym_reset_return_info`), `num_threads` or `max_episode_steps` given both as an
        argument and in `kwargs` with different values, or an observation or action space
        this contract does not support.
    """

    def __init__(self, task_id, num_envs, num_threads=None, seed=0, max_episode_steps=None,
                 kwargs=None):
        check_task_id(task_id)
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self._task_id = task_id
        num_threads, self._limit, self._options = resolve_options(
            task_id, num_threads, max_episode_steps, kwargs)
        self._options["num_threads"] = num_threads or os.cpu_count() or 1
        # EnvPool's own limit is never reached: an episode ends here at `self._limit`.
        self._options["max_episode_steps"] = self._limit + 1
        self._num_envs = int(num_envs)
        self._pool = None
        self._build(int(seed))
        observation_space, self._keys = _observation_space(self._pool_spaces[0])
        action_space, self._action_low, self._action_high = _action_space(
            self._pool_spaces[1])
        self._init_contract(self._num_envs, observation_space, action_space)
        self._all = self._all_indices.astype(np.int32)

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

    def __getitem__(self, index):
        raise TypeError("an EnvPool batch has no per-environment objects; use the batch's "
                        "step and reset with indices")

    @property
    def task_id(self):
        """The EnvPool task id (str)."""
        return self._task_id

    @property
    def max_episode_steps(self):
        """The episode length limit in steps (int)."""
        return self._limit

    @property
    def num_threads(self):
        """EnvPool's worker threads (int)."""
        return self._options["num_threads"]

    @property
    def blocking(self):
        """True: every call returns once EnvPool has stepped or reset the environments."""
        return True

    def _step(self, actions):
        """Steps all environments; infos a sequence of `B` dicts (EnvPool's per-environment
        info values, built when read).

        Raises:
          RuntimeError: an environment's episode ended and it was not reset since (or it
            was never reset, or it returned a non-finite value).
        """
        if self._done.any():
            index = int(np.flatnonzero(self._done)[0])
            raise RuntimeError(
                f"{self._env_name(index)}: its episode ended or never began; reset it "
                f"before stepping (EnvPool would reset it in place of this step)")
        if self._action_low is not None:
            actions = self._action_low + (np.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (
                self._action_high - self._action_low)
        self._fresh = False
        observ, reward, terminated, truncated, info = self._pool.step(actions, self._all)
        order = _order(info, self._all)
        observ = self._observ(observ, order)
        reward = np.asarray(reward, np.float32)[order]
        terminated = np.asarray(terminated, bool)[order]
        # EnvPool's own truncation: a task's internal time limit (DeepMind Control's).
        truncated = (np.asarray(truncated, bool)[order]
                     | (np.asarray(info["elapsed_step"])[order] >= self._limit))
        self._done = terminated | truncated
        return observ, reward, terminated, truncated, _Infos(info, order, self._num_envs)

    def _reset(self, indices, seed):
        """Resets the environments at `indices`; infos a sequence of dicts.

        Raises:
          ValueError: `seed` with only some of the indices (EnvPool seeds its environments
            when it builds the pool, so a seeded reset builds it again).
        """
        indices = indices.astype(np.int32)
        if seed is not None:
            if len(indices) != self._num_envs:
                raise ValueError(
                    f"EnvPool seeds its environments when it builds the pool: reset with a "
                    f"seed resets all {self._num_envs} environments, got indices "
                    f"{indices.tolist()}")
            if not (self._fresh and seed == self._seed):
                self._build(seed)
        self._fresh = False
        observ, info = self._pool.reset(indices)
        order = _order(info, indices)
        observ = self._observ(observ, order)
        self._done[indices] = False
        return observ, _Infos(info, order, len(indices))

    def close(self):
        """Stops EnvPool's threads; calling it again does nothing."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _on_error(self, error, indices):
        """The environments that returned non-finite values must be reset (see the
        class)."""
        self._done[indices] = True
        raise error

    def _env_name(self, index):
        return f"env {index} ({self._task_id})"

    def _observ(self, observ, order):
        if self._keys is not None:
            observ = np.concatenate(
                [np.reshape(observ[key], (len(observ[key]), -1)) for key in self._keys],
                axis=1)
        return np.asarray(observ, self.observation_space.dtype)[order]


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


def _observation_space(space):
    """The float32 `Box` of EnvPool's observation space (uint8 for a uint8 `Box`: frames)
    and, for a `Dict`, its keys in the order they are concatenated (None for a `Box`)."""
    if isinstance(space, spaces.Box) and space.dtype == np.uint8:
        return spaces.Box(0, 255, space.shape, np.uint8), None
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

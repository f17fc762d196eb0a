"""A batch of Gymnasium environments stepped together (no TensorFlow here)."""

import numpy as np

__all__ = ["BatchEnv"]


class BatchEnv:
    """Combines environments with equal spaces into one batch of size `B = len(envs)`.

    Args:
      envs: non-empty sequence of environments: `gymnasium.Env`s, or `ExternalProcess`es.
      blocking: True to step and reset the environments one after the other with blocking
        calls; False for `ExternalProcess`es (their `step` / `reset` accept `blocking=False`
        and return promises): every request is sent first, then all results are collected,
        so the environments work in parallel.

    Raises:
      ValueError: `envs` is empty, or the observation or action space of an environment
        differs from the first environment's (the message names the index and both spaces).
    """

    def __init__(self, envs, blocking):
        self._envs = list(envs)
        if not self._envs:
            raise ValueError("BatchEnv needs at least one environment")
        self._blocking = bool(blocking)
        self._observation_space = self._envs[0].observation_space
        self._action_space = self._envs[0].action_space
        for index, env in enumerate(self._envs[1:], start=1):
            if env.observation_space != self._observation_space:
                raise ValueError(
                    f"observation space of env {index} ({env.observation_space!r}) differs "
                    f"from that of env 0 ({self._observation_space!r})"
                )
            if env.action_space != self._action_space:
                raise ValueError(
                    f"action space of env {index} ({env.action_space!r}) differs "
                    f"from that of env 0 ({self._action_space!r})"
                )
        self._observ_shape = tuple(self._observation_space.shape)
        self._action_shape = (len(self._envs), *self._action_space.shape)

    def __len__(self):
        """The batch size `B`."""
        return len(self._envs)

    def __getitem__(self, index):
        """The environment at batch index `index`."""
        return self._envs[index]

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
        """Whether the environments are called one after the other (bool)."""
        return self._blocking

    def step(self, actions):
        """Steps all environments once.

        Args:
          actions: array-like `[B, *action_shape]`, one action per environment (`[B]` integers
            for a `Discrete` action space).

        Returns:
          `(observ, reward, terminated, truncated, infos)`: observ float32
          `[B, *observation_shape]`, reward float32 `[B]`, terminated bool `[B]`, truncated
          bool `[B]`, infos a tuple of `B` dicts.

        Raises:
          ValueError: `actions` does not have shape `[B, *action_shape]`, or an environment
            returned a NaN or infinite observation or reward, or an observation of the wrong
            shape (the message names the index and the value).
          WorkerError: an `ExternalProcess` failed (after all other results were collected).
        """
        actions = np.asarray(actions)
        if actions.shape != self._action_shape:
            raise ValueError(
                f"expected actions of shape {self._action_shape} (batch size "
                f"{len(self._envs)}, action shape {self._action_space.shape}), "
                f"got shape {actions.shape}"
            )
        if self._blocking:
            results = [env.step(action) for env, action in zip(self._envs, actions, strict=True)]
        else:
            promises = [
                env.step(action, blocking=False)
                for env, action in zip(self._envs, actions, strict=True)
            ]
            results = _collect(promises)
        observs, rewards, terminated, truncated, infos = zip(*results, strict=True)
        observ = self._stack_observations(observs, range(len(self._envs)))
        reward = np.asarray(rewards, dtype=np.float32)
        if not np.isfinite(reward).all():
            index = int(np.flatnonzero(~np.isfinite(reward))[0])
            raise ValueError(f"env {index} returned a non-finite reward: {rewards[index]!r}")
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        return observ, reward, terminated, truncated, tuple(infos)

    def reset(self, indices=None, seed=None):
        """Resets the environments at the given batch indices, and only those.

        Args:
          indices: sequence or 1-D integer array of batch indices; all environments if None.
          seed: optional int; environment `i` (a batch index) is then reset with seed
            `seed + i`.

        Returns:
          `(observ, infos)`: observ float32 `[len(indices), *observation_shape]`, infos a
          tuple of `len(indices)` dicts, in the order of `indices`.

        Raises:
          ValueError: an environment returned a NaN or infinite observation, or one of the
            wrong shape (the message names the index and the value).
          IndexError: an index is out of range (negative indices are not allowed).
          WorkerError: an `ExternalProcess` failed (after all other results were collected).
        """
        if indices is None:
            indices = range(len(self._envs))
        else:
            indices = [int(index) for index in np.asarray(indices, dtype=np.int64).reshape(-1)]
            for index in indices:
                if not 0 <= index < len(self._envs):
                    raise IndexError(
                        f"batch index {index} out of range for a batch of {len(self._envs)}"
                    )
        envs = [self._envs[index] for index in indices]
        seeds = [None if seed is None else int(seed) + index for index in indices]
        if self._blocking:
            results = [env.reset(seed=s) for env, s in zip(envs, seeds, strict=True)]
        else:
            promises = [
                env.reset(seed=s, blocking=False) for env, s in zip(envs, seeds, strict=True)
            ]
            results = _collect(promises)
        if not results:
            return np.zeros((0, *self._observ_shape), np.float32), ()
        observs, infos = zip(*results, strict=True)
        return self._stack_observations(observs, indices), tuple(infos)

    def close(self):
        """Closes every environment, even if closing one fails; then raises the first error."""
        error = None
        for env in self._envs:
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 - re-raised below.
                if error is None:
                    error = e
        if error is not None:
            raise error

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _stack_observations(self, observs, indices):
        """Stacks observations into float32 `[len(observs), *shape]` and checks them."""
        try:
            observ = np.asarray(observs, dtype=np.float32)
            ok_shape = observ.shape[1:] == self._observ_shape
        except ValueError:  # Ragged observations.
            ok_shape = False
        if not ok_shape:
            for index, value in zip(indices, observs, strict=True):
                if np.shape(value) != self._observ_shape:
                    raise ValueError(
                        f"env {index} returned an observation of shape {np.shape(value)}, "
                        f"expected {self._observ_shape}: {value!r}"
                    )
        if not np.isfinite(observ).all():
            bad = ~np.isfinite(observ.reshape(len(observ), -1)).all(axis=1)
            position = int(np.flatnonzero(bad)[0])
            index = list(indices)[position]
            raise ValueError(
                f"env {index} returned a non-finite observation: {observs[position]!r}"
            )
        return observ


def _collect(promises):
    """Calls every promise; raises the first error only once all results were collected."""
    results = []
    error = None
    for promise in promises:
        try:
            results.append(promise())
        except Exception as e:  # noqa: BLE001 - re-raised below.
            if error is None:
                error = e
    if error is not None:
        raise error
    return results

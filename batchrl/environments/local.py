"""A batch of Gymnasium environments stepped together (no TensorFlow here)."""

import numpy as np

from batchrl.environments.base import BaseBatchEnv

__all__ = ["BatchEnv"]


class BatchEnv(BaseBatchEnv):
    """Combines environments with equal spaces into one batch of size `B = len(envs)`.

    `step` and `reset` are those of `BaseBatchEnv` (the contract and its checks); here the
    environments are called in this process, or through `ExternalProcess`es. `step`
    passes each environment its row of `actions` as given (not converted to the action
    space's dtype). Further errors of `step` and `reset`: ValueError for an observation of
    the wrong shape (naming the index and the value); `WorkerError` when an
    `ExternalProcess` failed (raised once all other results were collected, so that the
    other environments stay in step).

    Args:
      envs: non-empty sequence of environments: `gymnasium.Env`s, or `ExternalProcess`es.
      blocking: True to step and reset the environments one after the other with blocking
        calls; False for `ExternalProcess`es (their `step` / `reset` accept `blocking=False`
        and return promises): every request is sent first, then all results are collected,
        so the environments work in parallel.

    Raises:
      ValueError: `envs` is empty, or the observation or action space of an environment
        differs from the first environment's (the message names the index and both spaces),
        or a space has no fixed shape or a non-numeric action dtype.
    """

    def __init__(self, envs, blocking):
        self._envs = list(envs)
        if not self._envs:
            raise ValueError("BatchEnv needs at least one environment")
        self._blocking = bool(blocking)
        self._init_contract(len(self._envs), self._envs[0].observation_space,
                            self._envs[0].action_space)
        self._check_spaces([(env.observation_space, env.action_space) for env in self._envs])

    def __getitem__(self, index):
        """The environment at batch index `index`."""
        return self._envs[index]

    @property
    def blocking(self):
        """Whether the environments are called one after the other (bool)."""
        return self._blocking

    def _step(self, actions):
        """Steps every environment with its row of `actions`; infos a tuple of `B` dicts."""
        if self._blocking:
            results = [env.step(action) for env, action in zip(self._envs, actions, strict=True)]
        else:
            promises = [
                env.step(action, blocking=False)
                for env, action in zip(self._envs, actions, strict=True)
            ]
            results = _collect(promises)
        observs, rewards, terminated, truncated, infos = zip(*results, strict=True)
        observ = self._stack_observations(observs, self._all_indices)
        reward = np.asarray(rewards, dtype=np.float32)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        return observ, reward, terminated, truncated, tuple(infos)

    def _reset(self, indices, seed):
        """Resets the environments at `indices`; infos a tuple of dicts."""
        envs = [self._envs[index] for index in indices.tolist()]
        seeds = [None if seed is None else seed + index for index in indices.tolist()]
        if self._blocking:
            results = [env.reset(seed=s) for env, s in zip(envs, seeds, strict=True)]
        else:
            promises = [
                env.reset(seed=s, blocking=False) for env, s in zip(envs, seeds, strict=True)
            ]
            results = _collect(promises)
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

    def _stack_observations(self, observs, indices):
        """Stacks observations into float32 `[len(observs), *shape]`; raises ValueError for
        one of the wrong shape."""
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
            raise ValueError(f"the observations cannot be stacked into a float32 array of "
                             f"shape [n, *{self._observ_shape}]")
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

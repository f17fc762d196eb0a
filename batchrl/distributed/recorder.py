"""What an actor's recordings share: the four methods `batchrl.drivers.simulate` drives,
`length` steps of every agent per recording, and the recording compiled once."""

import abc

import tensorflow as tf

from batchrl.drivers.simulate import episode_state, simulate_steps


class Recorder(abc.ABC):
    """The base of an actor's recordings (`fragment.FragmentRecorder`,
    `transitions.TransitionRecorder`): `simulate` drives its `begin_episodes`, `perform`
    and `experience` for `length` steps of every agent, continuing their episodes
    (`_steps`, compiled once), and `record` reads out what the subclass kept. Learns
    nothing. A subclass builds its variables before calling `__init__` last.

    Args:
      batch_env: the actor's `InGraphBatchEnv`.
      length: int >= 1, the steps per agent of a recording (`rollout_length`).
    """

    def __init__(self, batch_env, length):
        self._batch_env = batch_env
        self._length = int(length)
        episode_state(batch_env)  # Its variables exist before the first trace.
        self._collect = tf.function(self._collect_steps, autograph=False)

    @property
    def length(self):
        """int, the steps per agent of a recording."""
        return self._length

    @abc.abstractmethod
    def begin_episodes(self, agent_indices):
        """What a new episode of the given agents (int32 `[n]`) resets; returns the op."""

    @abc.abstractmethod
    def perform(self, agent_indices, observ):
        """The actions of the given agents for raw observations `[n, ...]`."""

    @abc.abstractmethod
    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Records the step of the given agents; returns the op."""

    def end_episodes(self, agent_indices):
        """Nothing to do: `done` of the step (`experience`) marks the end."""
        del agent_indices
        return tf.constant(True)

    def _steps(self):
        """Graph code: steps every agent `length` times; returns the ops to wait for."""
        return list(simulate_steps(self._batch_env, self, self._length, False, False))

    @abc.abstractmethod
    def _collect_steps(self):
        """Graph code of a recording: `_steps`, then what it kept, emptied for the next."""

    @abc.abstractmethod
    def record(self):
        """Steps every agent `length` times and returns the recording (NumPy arrays)."""

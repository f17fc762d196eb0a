"""An Ape-X actor's recording: `rollout_length` steps of every agent of its batch, acted by its
copy of an off-policy algorithm's acting half with its own exploration, turned into n-step
transitions as they complete, and given their first priorities with the acting half's
critic (Horgan et al. 2018, "Distributed Prioritized Experience Replay", arXiv:1803.00933,
algorithm 1)."""

import numpy as np
import tensorflow as tf

from batchrl.algorithms.base import checked
from batchrl.algorithms.off_policy import transition_specs
from batchrl.distributed.acting_values import ActingValues
from batchrl.distributed.recorder import Recorder
from batchrl.memories.episode import EpisodeMemory
from batchrl.memories.n_step import NStepAccumulator
from batchrl.memories.observation_storage import ObservationStorage
from batchrl.memories.storage import FIELDS, TransitionStorage
from batchrl.tools.graph import after


class TransitionRecorder(Recorder):
    """What `batchrl.drivers.simulate` drives in an Ape-X actor: `acting` (an off-policy
    algorithm's acting half with its critic, `batchrl.build.acting_half`) acts with its
    exploration, and each agent's steps go through an n-step accumulator
    (`NStepAccumulator`, as the learner's replay memory keeps them) into an outbox. Learns
    nothing.

    An agent's window runs on from one recording to the next, as in a replay memory of one
    process: the transitions of a recording are those its steps completed, so that they
    may start in an earlier recording, and steps still waiting stay for the next. A
    recording (`record`) is a dict of NumPy arrays:
      `transitions`: dict of `batchrl.memories.storage.FIELDS`, `[m, ...]`: `observ` and
        `nextob` raw in the memory's dtype (uint8 frames stay bytes), `action`, `reward`
        (the n-step return) and `discount` (`discount^k`, 0 after a termination), as
        `ReplayMemory.insert` takes them; m is at most `B (T + n_step - 1)`.
      `td_error`: float32 `[m]`, their absolute TD errors under the actor's networks
        (`Critic.td_error`; DQN's from the Q values it acted with,
        `acting_values.ActingValues`), which the learner's prioritized replay makes their
        first priorities.
      `reward`, `done`: float32 and bool `[B, T]`, the steps' rewards and ends (for the
        episodes' scores: `batchrl.distributed.actor.episodes`).
      `length`: int32 `[B]`, the steps of each agent (`T`).

    Args:
      batch_env: the actor's `InGraphBatchEnv`.
      acting: the acting half (`OffPolicyActor` with its `critic`), built for its agents.
      length: int >= 1, the steps per agent of a recording (`rollout_length`).
      n_step, discount: the n-step returns' n (int >= 1) and discount factor (float), the
        config's `n_step` and `discount`.
    """

    def __init__(self, batch_env, acting, length, n_step, discount):
        self._acting = acting
        agents = len(batch_env)
        observ_spec, action_spec = transition_specs(batch_env)
        self._accumulator = NStepAccumulator(observ_spec, action_spec, agents, int(n_step),
                                             float(discount))
        self._outbox = TransitionStorage(
            ObservationStorage(*observ_spec), action_spec,
            agents * (int(length) + int(n_step) - 1))
        self._rows = EpisodeMemory({"reward": ((), tf.float32), "done": ((), tf.bool)},
                                   agents, int(length), "steps")
        # DQN keeps the Q values it acts with for the TD errors (`ActingValues`).
        self._values = None
        if hasattr(acting, "act_with_values"):
            self._values = ActingValues(acting, agents, int(n_step), self._outbox.capacity)
        super().__init__(batch_env, length)

    def begin_episodes(self, agent_indices):
        """Stores the steps still waiting in the given agents' windows as a truncated
        episode's (a new episode begins without the old one ending, as
        `ReplayMemory.reset_agents` does) and zeroes their exploration's noise."""
        agent_indices = tf.cast(agent_indices, tf.int32)
        if self._values is None:
            return after([self._accumulator.flush(agent_indices, self._write),
                          self._acting.exploration.reset(agent_indices)], True)
        flushed = self._accumulator.flush(agent_indices, self._values.writer(self._outbox.write))
        with tf.control_dependencies([flushed]):
            reset = self._values.reset(agent_indices)
        return after([reset, self._acting.exploration.reset(agent_indices)], True)

    def perform(self, agent_indices, observ):
        """The acting half's explored actions for the given agents (DQN's through
        `ActingValues.perform`, which keeps their Q values).

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        if self._values is not None:
            return self._values.perform(agent_indices, observ)
        action, _ = self._acting.act(observ, None, True, tf.cast(agent_indices, tf.int32))
        return checked(action)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Adds the step of the given agents to their windows, the transitions it completes
        to the outbox, and the reward and end to the recording."""
        agent_indices = tf.cast(agent_indices, tf.int32)
        terminated = tf.gather(self._batch_env.terminated, agent_indices)
        truncated = tf.logical_and(done, tf.logical_not(terminated))
        write = self._write if self._values is None else self._values.writer(
            self._outbox.write, agent_indices, action, done)
        added = self._accumulator.add(agent_indices, observ, action, reward, terminated,
                                      truncated, nextob, write)
        recorded = self._rows.append({"reward": reward, "done": done}, agent_indices)
        return after([added, recorded], True)

    def _write(self, transitions, emit=None):
        count, _, _ = self._outbox.write(transitions, emit)
        return count

    def _collect_steps(self):
        with tf.control_dependencies(self._steps()):
            count = self._outbox.size.value()
            transitions = self._outbox.gather(tf.range(count))
            if self._values is None:
                td_error = self._acting.critic.td_error(transitions)
            else:
                td_error = self._values.td_error(transitions, count)
            fields, length = self._rows.data()
        read = list(transitions.values()) + list(fields.values()) + [td_error, length]
        with tf.control_dependencies(read):
            cleared = [self._rows.clear(), self._outbox.size.assign(0),
                       self._outbox.position.assign(0)]
        with tf.control_dependencies(cleared):
            return ({key: tf.identity(value) for key, value in transitions.items()},
                    tf.identity(td_error),
                    {key: tf.identity(value) for key, value in fields.items()},
                    tf.identity(length))

    def record(self):
        """Steps every agent `length` times, continuing their episodes, and returns the
        recording (dict of NumPy arrays, see the class docstring)."""
        transitions, td_error, fields, length = self._collect()
        recording = {key: np.asarray(value) for key, value in fields.items()}
        recording.update(transitions={key: np.asarray(transitions[key]) for key in FIELDS},
                         td_error=np.asarray(td_error), length=np.asarray(length))
        return recording

    collect = record  # What `batchrl.distributed.actor` calls: it travels as it is.

"""The Q values a DQN actor acted with, kept for its transitions' first priorities, so that
their TD errors take one network pass (the target network's on s_{t+n}) instead of three
(Horgan et al. 2018, "Distributed Prioritized Experience Replay", arXiv:1803.00933,
algorithm 1: the actor's local buffer keeps the Q values of acting).

A transition of the steps t .. t+n-1 of an agent needs Q(s_t, a_t), from the pass that chose
a_t, and Q(s_{t+n}, .), from the pass that chooses the agent's next action when s_{t+n} is
the observation it acts on next (its episode goes on). Those values are waited for; the
others (after a truncation, a forced reset, or the recording's last steps) come from one
pass over their `nextob` when the recording ends; after a termination none is needed.
"""

import tensorflow as tf

from batchrl.algorithms.base import checked
from batchrl.tools.graph import after


class ActingValues:
    """The values of `DQNActor.act_with_values` held for an actor's outbox
    (`transitions.TransitionRecorder`): each agent's latest Q(s, .), Q(s, a) of the steps
    waiting in its n-step window, and for each outbox row Q(s, a) of its first step and,
    once acted on, Q(s', .). Non-trainable variables, not in checkpoints (an actor keeps
    none).

    Args:
      acting: the actor's acting half (`DQNActor`, with its critic).
      agents: int, the batch's agents.
      n_step: int >= 1, the accumulator's n.
      rows: int, the outbox's capacity (its spare row is one more).
    """

    def __init__(self, acting, agents, n_step, rows):
        self._acting = acting
        actions = acting.count
        self._n_step = n_step
        self.latest = tf.Variable(tf.zeros([agents, actions]), trainable=False)
        self.window = tf.Variable(tf.zeros([agents, max(n_step - 1, 0)]), trainable=False)
        self.waiting = tf.Variable(tf.fill([agents], -1), trainable=False)
        self.q_taken = tf.Variable(tf.zeros([rows + 1]), trainable=False)
        self.next_q = tf.Variable(tf.zeros([rows + 1, actions]), trainable=False)
        self.has_next = tf.Variable(tf.zeros([rows + 1], tf.bool), trainable=False)

    def perform(self, agent_indices, observ):
        """The acting half's explored actions (`act_with_values`); keeps their Q values as
        the agents' latest, and as Q(s', .) of the rows that waited for these agents' next
        observations.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        agents = tf.cast(agent_indices, tf.int32)
        action, q = self._acting.act_with_values(observ, True, agents)
        action = checked(action)
        rows = tf.gather(self.waiting, agents)
        waited = rows >= 0
        rows = tf.where(waited, rows, self.q_taken.shape[0] - 1)  # The others: spare row.
        updates = [self.latest.scatter_nd_update(agents[:, None], q),
                   self.next_q.scatter_nd_update(rows[:, None], q),
                   self.has_next.scatter_nd_update(rows[:, None], waited),
                   self.waiting.scatter_nd_update(agents[:, None], tf.fill(tf.shape(agents),
                                                                           -1))]
        return after(updates, action)

    def writer(self, write, agent_indices=None, action=None, done=None):
        """The accumulator's writer for one `add` (given the step's agents, int32 actions
        `[n]` and bool ends `[n]`) or one `flush` (none given): it writes with `write` (a
        `TransitionStorage.write`), keeps each candidate's Q(s, a) for its row and, for an
        agent whose episode goes on, the row that waits for its next values; then moves the
        windows on as the accumulator does. Returns the writer (`n_step` module docstring)."""

        def write_values(transitions, emit):
            if agent_indices is None:  # A flush: every agent's window, no new step.
                taken, waits = self.window.value(), None
            else:
                agents = tf.cast(agent_indices, tf.int32)
                latest = tf.gather(tf.gather(self.latest, agents), tf.cast(action, tf.int32),
                                   batch_dims=1)
                taken = tf.concat([tf.gather(self.window, agents), latest[:, None]], 1)
                waits = tf.logical_not(tf.cast(done, tf.bool))
            count, rows, keep = write(transitions, emit)
            kept = tf.ones_like(rows, tf.bool) if keep is None else keep
            updates = [self.q_taken.scatter_nd_update(rows[:, None], tf.reshape(taken, [-1])),
                       self.has_next.scatter_nd_update(rows[:, None], tf.zeros_like(kept))]
            if waits is not None:
                updates += self._moved_on(agents, taken, waits, rows, kept)
            return after(updates, count)

        return write_values

    def _moved_on(self, agents, taken, waits, rows, kept):
        """The windows' new values after an `add` and the rows that wait: with `n_step` > 1
        the candidates are `n_step` per agent, only the first leaving without an end."""
        width = taken.shape[1]
        first = tf.reshape(rows, [-1, width])[:, 0]
        stored = tf.reshape(kept, [-1, width])[:, 0]
        waiting = tf.where(waits & stored, first, -1)
        updates = [self.waiting.scatter_nd_update(agents[:, None], waiting)]
        if self._n_step > 1:
            updates.append(self.window.scatter_nd_update(agents[:, None], taken[:, 1:]))
        return updates

    def reset(self, agent_indices):
        """Forgets the rows waiting for these agents (a new episode begins: the next
        observation is not their `nextob`)."""
        agents = tf.cast(agent_indices, tf.int32)
        return self.waiting.scatter_nd_update(agents[:, None], tf.fill(tf.shape(agents), -1))

    def td_error(self, transitions, count):
        """The absolute TD errors of the outbox's first `count` rows (`transitions`, dict of
        their fields), from the kept values and, for rows without Q(s', .) that bootstrap,
        one online pass over their `nextob` (`DQNCritic.td_error_from_values`); then forgets the
        waiting rows, whose values the next recording's first step would bring: float32
        `[count]`."""
        rows = tf.range(count)
        next_q = tf.gather(self.next_q, rows)
        missing = tf.where(tf.logical_not(tf.gather(self.has_next, rows))
                           & (transitions["discount"] > 0))
        computed = self._acting.values(tf.gather_nd(transitions["nextob"], missing))
        next_q = tf.tensor_scatter_nd_update(next_q, missing, computed)
        error = self._acting.critic.td_error_from_values(
            transitions, tf.gather(self.q_taken, rows), next_q)
        with tf.control_dependencies([error]):
            cleared = [self.waiting.assign(tf.fill(tf.shape(self.waiting), -1)),
                       self.has_next.assign(tf.zeros_like(self.has_next))]
        return after(cleared, error)

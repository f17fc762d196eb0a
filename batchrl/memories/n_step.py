"""The n-step accumulator: turns each agent's steps into transitions with n-step returns
(Sutton & Barto 2018, sec. 7.1) and hands them to a writer, a replay memory's storage or
anything else that takes transitions (e.g. an actor's outbox to a distant learner).

A writer is a function `write(transitions, emit) -> count`: `transitions` a dict of
`batchrl.memories.storage.FIELDS` of m candidates `[m, *shape]`, in the dtypes of
`transition_specs`; `emit` bool `[m]`, the candidates to keep, or None for all of them;
`count` an int32 scalar, the number kept, available once they are written.
"""

import numpy as np
import tensorflow as tf

from batchrl.memories.storage import cast_fields, transition_specs


class NStepAccumulator:
    """Each agent's last steps, waiting until `n_step` of them make a return.

    With `n_step > 1`, non-trainable variables created in the caller's name scope (the
    module that owns them tracks them for checkpoints, e.g. `ReplayMemory`):
      `window`: dict of `observ`, `action`, `reward` to `[num_agents, n_step - 1, *shape]`
        variables (named `window_observ`, ...), each agent's waiting steps, the newest
        last.
      `pending`: int32 `[num_agents]`, the number of waiting steps of each agent.
      `last_nextob`: `[num_agents, *observ shape]`, the observation after each agent's last
        step, which `flush` bootstraps from.
    With `n_step = 1` there are none (`window`, `pending`, `last_nextob` are None): every
    step leaves at once.

    Args:
      observ_spec, action_spec: `(shape tuple, tf.DType)` of one observation and one action.
      num_agents: int >= 1, the number of agents.
      n_step: int >= 1, the number of steps summed into a return.
      discount: float in [0, 1], the discount factor gamma.
      (All checked by the caller.)
    """

    def __init__(self, observ_spec, action_spec, num_agents, n_step, discount):
        self._specs = transition_specs(observ_spec, action_spec)
        self._num_agents = num_agents
        self._n_step = n_step
        self._discount = discount
        self.window = self.pending = self.last_nextob = None
        if n_step == 1:
            return
        shape = (num_agents, n_step - 1)
        self.window = {
            key: tf.Variable(tf.zeros(shape + self._specs[key][0], self._specs[key][1]),
                             trainable=False, name=f"window_{key}")
            for key in ("observ", "action", "reward")}
        self.pending = tf.Variable(tf.zeros([num_agents], tf.int32), trainable=False,
                                   name="pending")
        nextob_shape, nextob_dtype = self._specs["nextob"]
        self.last_nextob = tf.Variable(tf.zeros((num_agents,) + nextob_shape, nextob_dtype),
                                       trainable=False, name="last_nextob")

    def add(self, agent_indices, observ, action, reward, terminated, truncated, nextob,
            write):
        """Adds one batch step of the given agents and writes the transitions it completes.

        Each agent's last steps wait in its window until `n_step` steps are there; then the
        oldest leaves as a transition with the return `R = sum_{i<n} discount^i r_{t+i}`,
        the discount `discount^n` and the `nextob` of this step (Sutton & Barto 2018, eq.
        7.1). When an episode ends at this step, all its waiting steps leave at once, each
        with its partial return up to the end and `discount^k` (k the steps to the end) on a
        truncation, which bootstraps from the final observation `nextob`, or 0 on a
        termination, which does not; the window empties. With `n_step = 1` every step leaves
        at once. The candidates go to `write` in the order of `agent_indices`, each agent's
        oldest first (with `n_step > 1`, `n_step` candidates per agent, `emit` marking those
        that leave; with `n_step = 1` one each, `emit` None).

        Args:
          agent_indices: int32 `[n]`, distinct agents in `[0, num_agents)`.
          observ: `[n, *observ shape]`, the observations the actions were chosen at.
          action: `[n, *action shape]`.
          reward: float32 `[n]`.
          terminated: bool `[n]`, the episode ended in a terminal state.
          truncated: bool `[n]`, the episode was cut off (time limit).
          nextob: `[n, *observ shape]`, the observations after the step (the final
            observation when the episode ended).
          write: the writer (module docstring).

        Returns:
          int32 scalar, `write`'s count, after the windows are updated.
        """
        step = cast_fields({"observ": observ, "action": action, "reward": reward,
                            "nextob": nextob}, self._specs)
        terminated = tf.cast(terminated, tf.bool)
        done = terminated | tf.cast(truncated, tf.bool)
        if self._n_step == 1:
            step["discount"] = tf.where(terminated, 0.0, self._discount)
            return write(step, None)
        agents = tf.cast(agent_indices, tf.int32)
        n = self._n_step
        filled = tf.gather(self.pending, agents) + 1
        steps = {key: tf.concat([tf.gather(var, agents), step[key][:, None]], 1)
                 for key, var in self.window.items()}
        transitions, valid = self._window_transitions(steps, filled, terminated,
                                                      step["nextob"])
        full = (tf.range(n)[None] == 0) & (filled[:, None] == n)
        emit = valid & (done[:, None] | full)
        count = write(transitions, tf.reshape(emit, [-1]))
        rows = agents[:, None]
        updates = [var.scatter_nd_update(rows, steps[key][:, 1:])
                   for key, var in self.window.items()]
        pending = tf.where(done, 0, tf.minimum(filled, n - 1))
        updates.append(self.pending.scatter_nd_update(rows, pending))
        updates.append(self.last_nextob.scatter_nd_update(rows, step["nextob"]))
        with tf.control_dependencies(updates):
            return tf.identity(count)

    def flush(self, agent_indices, write):
        """Ends the episodes of these agents after their last step without a termination
        (a new episode began without the old one ending, e.g. a forced reset): their
        waiting steps leave as transitions of a truncated episode, as in `add`, each with
        its partial return up to the last step and `discount^k` (k the steps to the end),
        bootstrapping from the observation after the last step (`last_nextob`); the windows
        empty. The candidates go to `write` in the order of the agents' indices, each
        agent's oldest first: those of all agents' windows, `emit` marking the waiting steps
        of these agents, so that every shape is static.

        Args:
          agent_indices: int32 `[n]`, distinct agents in `[0, num_agents)`.
          write: the writer (module docstring).

        Returns:
          int32 scalar, `write`'s count (0 with `n_step = 1`, without calling it), after
          the windows are emptied.
        """
        if self._n_step == 1:
            return tf.constant(0, tf.int32)
        agents = tf.cast(agent_indices, tf.int32)
        cut = tf.scatter_nd(agents[:, None], tf.ones_like(agents), [self._num_agents]) > 0
        pending = self.pending.value()
        transitions, valid = self._window_transitions(
            {key: var.value() for key, var in self.window.items()}, pending,
            tf.zeros_like(cut), self.last_nextob.value())
        count = write(transitions, tf.reshape(valid & cut[:, None], [-1]))
        with tf.control_dependencies([count]):
            update = self.pending.assign(tf.where(cut, 0, pending))
        with tf.control_dependencies([update]):
            return tf.identity(count)

    def _window_transitions(self, steps, filled, terminated, nextob):
        """The transitions of windows whose episodes end after their newest step.

        Args:
          steps: dict of `observ`, `action`, `reward`, `[k, w, ...]`: k windows of w
            slots, the newest step last.
          filled: int32 `[k]`, the valid (newest) slots of each window.
          terminated: bool `[k]`, the episode ended in a terminal state.
          nextob: `[k, *observ shape]`, the observation after the newest step.

        Returns:
          `(transitions, valid)`: the dict of `FIELDS` of all `k * w` slots, slot i of a
          window with the return `sum_{j=i}^{w-1} discount^(j-i) r_j` over the valid steps
          and the discount `discount^(w-i)` (0 when terminated), bootstrapping from
          `nextob`; and bool `[k, w]`, the valid slots.
        """
        width = steps["reward"].shape[1]
        valid = tf.range(width)[None] >= width - filled[:, None]
        rewards = tf.where(valid, steps["reward"], 0.0)
        exponent = np.arange(width)[:, None] - np.arange(width)[None]
        weights = np.where(exponent >= 0, self._discount ** np.maximum(exponent, 0), 0.0)
        returns = tf.linalg.matmul(rewards, tf.constant(weights, tf.float32))
        powers = tf.constant(self._discount ** (width - np.arange(width)), tf.float32)
        discounts = tf.where(terminated[:, None], 0.0, powers[None])
        observ_shape = self._specs["observ"][0]
        transitions = {
            "observ": tf.reshape(steps["observ"], (-1,) + observ_shape),
            "action": tf.reshape(steps["action"], (-1,) + self._specs["action"][0]),
            "reward": tf.reshape(returns, [-1]),
            "discount": tf.reshape(discounts, [-1]),
            "nextob": tf.reshape(tf.repeat(nextob[:, None], width, axis=1),
                                 (-1,) + observ_shape)}
        return transitions, valid

"""A replay memory of transitions in TensorFlow variables, for the off-policy algorithms.

A ring buffer of `capacity` transitions `(observ, action, reward, discount, nextob)`, filled
one batch step of several agents at a time with n-step returns (Sutton & Barto 2018, sec.
7.1), or with ready transitions from outside, and sampled uniformly or by proportional
prioritization (Schaul et al. 2016, arXiv:1511.05952). All state, the sampling generator
included, lives in the module's variables, so that `tf.train.Checkpoint(memory=memory)` saves
and restores it. Every method is graph code with static shapes: it runs eagerly, inside
`tf.function` and inside `tf.function(jit_compile=True)` (XLA), also within a `tf.while_loop`.
"""

import math

import numpy as np
import tensorflow as tf

from batchrl.memories.observation_storage import ObservationStorage
from batchrl.memories.sum_tree import SumTree

FIELDS = ("observ", "action", "reward", "discount", "nextob")
PRIORITIZED_DEFAULTS = {"alpha": 0.6, "beta": 0.4, "epsilon": 1e-6}


def _check_spec(spec, what):
    """Returns `(shape tuple of ints, tf.DType)` of a `(shape, dtype)` pair; ValueError if it
    is not one."""
    try:
        shape, dtype = spec
        shape = tuple(int(size) for size in shape)
        dtype = tf.as_dtype(dtype)
    except (TypeError, ValueError) as error:
        raise ValueError(f"ReplayMemory: {what} must be (shape tuple, dtype), got {spec!r}") \
            from error
    return shape, dtype


def _check_int(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"ReplayMemory: {what} must be an int >= 1, got {value!r}")
    return int(value)


def _check_prioritized(prioritized):
    """The prioritized-replay settings with defaults filled in, or None; ValueError on an
    unknown key or a value out of range."""
    if prioritized is None or prioritized is False:
        return None
    if prioritized is True:
        prioritized = {}
    if not isinstance(prioritized, dict):
        raise ValueError(
            f"ReplayMemory: prioritized must be None or a dict, got {prioritized!r}")
    unknown = sorted(set(prioritized) - set(PRIORITIZED_DEFAULTS))
    if unknown:
        raise ValueError(f"ReplayMemory: unknown prioritized key(s) {unknown}; the keys are "
                         f"{sorted(PRIORITIZED_DEFAULTS)}")
    config = {**PRIORITIZED_DEFAULTS, **prioritized}
    for key in PRIORITIZED_DEFAULTS:
        config[key] = float(config[key])
    if config["alpha"] < 0:
        raise ValueError(f"ReplayMemory: prioritized alpha must be >= 0, got {config['alpha']}")
    if not 0 <= config["beta"] <= 1:
        raise ValueError(f"ReplayMemory: prioritized beta must be in [0, 1], got "
                         f"{config['beta']}")
    if config["epsilon"] <= 0:
        raise ValueError(f"ReplayMemory: prioritized epsilon must be > 0, got "
                         f"{config['epsilon']}")
    return config


class ReplayMemory(tf.Module):
    """Ring buffer of transitions with n-step returns and optional prioritized sampling.

    Storage, non-trainable variables of `capacity + 1` rows (the last row takes the writes
    of candidates that are not stored, so that every write has a static shape):
      `storage["observ"]`: `[capacity + 1, *observ shape]`, the observation's dtype.
      `storage["action"]`: `[capacity + 1, *action shape]`, the action's dtype.
      `storage["reward"]`: float32 `[capacity + 1]`, the k-step return
        `sum_{i<k} discount^i r_{t+i}`.
      `storage["discount"]`: float32 `[capacity + 1]`, `discount^k` to apply to the value of
        `nextob`, or 0 when the window ended with a termination.
      `storage["nextob"]`: like `observ`, the observation k steps later (the final
        observation of the episode when the window reached its end).
    With `byte_elements`, `observ` and `nextob` each keep their other elements (float32) and
    `storage["observ_bytes"]`, `storage["nextob_bytes"]` (uint8) the byte elements
    (`batchrl.memories.observation_storage`).
    `size` and `position` (int32 scalars) count the stored transitions (at most `capacity`)
    and give the next row written; the oldest transition is overwritten first. With
    `n_step > 1` each agent has a staging window of its last `n_step - 1` steps and keeps
    the observation after its last step (`reset_agents` bootstraps from it).

    Args:
      observ_spec: `(shape, dtype)` of one observation (a flat tensor); observations are
        stored in this dtype (uint8 stays uint8; float inputs are cast to it).
      action_spec: `(shape, dtype)` of one action, stored in this dtype.
      capacity: int >= 1, the number of transitions stored.
      num_agents: int >= 1, the number of agents whose steps `add` receives.
      n_step: int >= 1, the number of steps summed into a return.
      discount: float in [0, 1], the discount factor gamma.
      prioritized: None for uniform sampling, or a dict with any of `alpha` (>= 0, default
        0.6), `beta` (in [0, 1], default 0.4), `epsilon` (> 0, default 1e-6) for
        proportional prioritization (`True` takes the defaults).
      seed: int, seed of the memory's own `tf.random.Generator`.
      byte_elements: None, or bool array of the observation shape: for float32 vector
        observations (flattened nested ones), the elements that are always integers in
        [0, 255] (pixels, one-hot elements), stored as uint8.
      name: name scope of the variables.

    Raises:
      ValueError: if `capacity`, `num_agents` or `n_step` is < 1 or not an int, `discount` is
        outside [0, 1], a spec is not `(shape, dtype)`, `prioritized` has an unknown key or
        a value out of range, or `byte_elements` has another shape; the message names the
        culprit.
    """

    def __init__(self, observ_spec, action_spec, capacity, num_agents, n_step=1, discount=0.99,
                 prioritized=None, seed=0, byte_elements=None, name="replay"):
        super().__init__(name=name)
        self._observ_spec = _check_spec(observ_spec, "observ_spec")
        self._observ_storage = ObservationStorage(*self._observ_spec, byte_elements)
        self._action_spec = _check_spec(action_spec, "action_spec")
        self._capacity = _check_int(capacity, "capacity")
        self._num_agents = _check_int(num_agents, "num_agents")
        self._n_step = _check_int(n_step, "n_step")
        if isinstance(discount, bool) or not 0 <= float(discount) <= 1:
            raise ValueError(f"ReplayMemory: discount must be in [0, 1], got {discount!r}")
        self._discount = float(discount)
        self._prioritized = _check_prioritized(prioritized)
        rows = self._capacity + 1
        specs = self._field_specs()
        with self.name_scope:
            self.storage = {
                key: tf.Variable(tf.zeros((rows,) + shape, dtype), trainable=False, name=key)
                for key, (shape, dtype) in specs.items()}
            self._size = tf.Variable(0, dtype=tf.int32, trainable=False, name="size")
            self._position = tf.Variable(0, dtype=tf.int32, trainable=False, name="position")
            if self._n_step > 1:
                shape = (self._num_agents, self._n_step - 1)
                window = self._step_specs()
                self.window = {
                    key: tf.Variable(tf.zeros(shape + window[key][0], window[key][1]),
                                     trainable=False, name=f"window_{key}")
                    for key in ("observ", "action", "reward")}
                self._pending = tf.Variable(tf.zeros([self._num_agents], tf.int32),
                                            trainable=False, name="pending")
                # The observation after each agent's last step, which `reset_agents`
                # bootstraps the waiting steps from.
                nextob_shape, nextob_dtype = window["nextob"]
                self._last_nextob = tf.Variable(
                    tf.zeros((self._num_agents,) + nextob_shape, nextob_dtype),
                    trainable=False, name="last_nextob")
            if self._prioritized:
                # One more leaf for the spare row, which always keeps priority 0.
                self.priorities = SumTree(rows, name="priorities")
                self._max_priority = tf.Variable(1.0, trainable=False, name="max_priority")
            self.generator = tf.random.Generator.from_seed(seed)

    def _step_specs(self):
        """`(shape, dtype)` of each of `FIELDS` in one transition, as `add` takes them."""
        observ, action = self._observ_spec, self._action_spec
        scalar = ((), tf.float32)
        return {"observ": observ, "action": action, "reward": scalar, "discount": scalar,
                "nextob": observ}

    def _field_specs(self):
        """`(shape, dtype)` of one row of each storage variable."""
        specs = self._step_specs()
        storage = self._observ_storage
        return {**storage.specs("observ"), "action": specs["action"],
                "reward": specs["reward"], "discount": specs["discount"],
                **storage.specs("nextob")}

    @property
    def capacity(self):
        """int, the number of transitions the memory holds."""
        return self._capacity

    @property
    def num_agents(self):
        """int, the number of agents."""
        return self._num_agents

    @property
    def n_step(self):
        """int, the number of steps summed into a stored return."""
        return self._n_step

    @property
    def discount_factor(self):
        """float, the discount factor gamma of the n-step returns."""
        return self._discount

    @property
    def prioritized(self):
        """The prioritized-replay settings (dict `alpha`, `beta`, `epsilon`), or None."""
        return dict(self._prioritized) if self._prioritized else None

    @property
    def size(self):
        """int32 scalar tensor, the number of stored transitions (at most `capacity`)."""
        return self._size.value()

    @property
    def position(self):
        """int32 scalar tensor, the row the next transition is written to."""
        return self._position.value()

    @property
    def bytes_per_transition(self):
        """int, the bytes of one stored transition over all its variables: the five fields
        and, when prioritized, its share of the sum tree (`2 P` float32 entries over
        `capacity` transitions, rounded up). The spare row, the staging windows and the
        agents' last next observations (a fixed amount per agent) are not counted."""
        total = sum(dtype.size * math.prod(shape) for shape, dtype in
                    self._field_specs().values())
        if self._prioritized:
            total += -(-self.priorities.tree.shape[0] * 4 // self._capacity)
        return total

    def add(self, agent_indices, observ, action, reward, terminated, truncated, nextob):
        """Adds one batch step of the given agents, storing the transitions it completes.

        Each agent's last steps wait in its window until `n_step` steps are there; then the
        oldest leaves as a transition with the return `R = sum_{i<n} discount^i r_{t+i}`,
        the discount `discount^n` and the `nextob` of this step (Sutton & Barto 2018, eq.
        7.1). When an episode ends at this step, all its waiting steps leave at once, each
        with its partial return up to the end and `discount^k` (k the steps to the end) on a
        truncation, which bootstraps from the final observation `nextob`, or 0 on a
        termination, which does not; the window empties. With `n_step = 1` every step leaves
        at once. The transitions are written in the order of `agent_indices`, each agent's
        oldest first; if there are more than `capacity` of them only the last are kept.

        Args:
          agent_indices: int32 `[n]`, distinct agents in `[0, num_agents)`.
          observ: `[n, *observ shape]`, the observations the actions were chosen at.
          action: `[n, *action shape]`.
          reward: float32 `[n]`.
          terminated: bool `[n]`, the episode ended in a terminal state.
          truncated: bool `[n]`, the episode was cut off (time limit).
          nextob: `[n, *observ shape]`, the observations after the step (the final
            observation when the episode ended).

        Returns:
          int32 scalar, the number of transitions inserted, after they are stored.
        """
        step = self._cast({"observ": observ, "action": action, "reward": reward,
                           "nextob": nextob})
        terminated = tf.cast(terminated, tf.bool)
        done = terminated | tf.cast(truncated, tf.bool)
        if self._n_step == 1:
            step["discount"] = tf.where(terminated, 0.0, self._discount)
            return self._write(step)
        return self._add_n_step(tf.cast(agent_indices, tf.int32), step, terminated, done)

    def _add_n_step(self, agents, step, terminated, done):
        """`add` for `n_step > 1`: candidates `[n, n_step]`, the emitted ones written."""
        n = self._n_step
        filled = tf.gather(self._pending, agents) + 1
        steps = {key: tf.concat([tf.gather(var, agents), step[key][:, None]], 1)
                 for key, var in self.window.items()}
        transitions, valid = self._window_transitions(steps, filled, terminated,
                                                      step["nextob"])
        full = (tf.range(n)[None] == 0) & (filled[:, None] == n)
        emit = valid & (done[:, None] | full)
        count = self._write(transitions, tf.reshape(emit, [-1]))
        rows = agents[:, None]
        updates = [var.scatter_nd_update(rows, steps[key][:, 1:])
                   for key, var in self.window.items()]
        pending = tf.where(done, 0, tf.minimum(filled, n - 1))
        updates.append(self._pending.scatter_nd_update(rows, pending))
        updates.append(self._last_nextob.scatter_nd_update(rows, step["nextob"]))
        with tf.control_dependencies(updates):
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
        observ_shape = self._observ_spec[0]
        transitions = {
            "observ": tf.reshape(steps["observ"], (-1,) + observ_shape),
            "action": tf.reshape(steps["action"], (-1,) + self._action_spec[0]),
            "reward": tf.reshape(returns, [-1]),
            "discount": tf.reshape(discounts, [-1]),
            "nextob": tf.reshape(tf.repeat(nextob[:, None], width, axis=1),
                                 (-1,) + observ_shape)}
        return transitions, valid

    def reset_agents(self, agent_indices):
        """Ends the episodes of these agents after their last step without a termination
        (a new episode began without the old one ending, e.g. a forced reset): their
        waiting steps leave as transitions of a truncated episode, as in `add`, each with
        its partial return up to the last step and `discount^k` (k the steps to the end),
        bootstrapping from the observation after the last step (the `nextob` `add` was
        last given for the agent); the windows empty. The transitions are written in the
        order of the agents' indices, each agent's oldest first. The windows of all agents
        are computed, those of the others not stored, so that every shape is static.

        Args:
          agent_indices: int32 `[n]`, distinct agents in `[0, num_agents)`.

        Returns:
          int32 scalar, the number of transitions inserted, after they are stored.
        """
        if self._n_step == 1:
            return tf.constant(0, tf.int32)
        agents = tf.cast(agent_indices, tf.int32)
        cut = tf.scatter_nd(agents[:, None], tf.ones_like(agents), [self._num_agents]) > 0
        pending = self._pending.value()
        transitions, valid = self._window_transitions(
            {key: var.value() for key, var in self.window.items()}, pending,
            tf.zeros_like(cut), self._last_nextob.value())
        count = self._write(transitions, tf.reshape(valid & cut[:, None], [-1]))
        with tf.control_dependencies([count]):
            update = self._pending.assign(tf.where(cut, 0, pending))
        with tf.control_dependencies([update]):
            return tf.identity(count)

    def insert(self, transitions):
        """Writes ready transitions as they are (e.g. external one-step transitions).

        Args:
          transitions: dict with `observ` and `nextob` `[n, *observ shape]`, `action`
            `[n, *action shape]` (cast to the stored dtypes), `reward` and `discount` float32
            `[n]` (`discount` multiplies the value of `nextob`: 0 at a termination). Other
            keys are ignored.

        Returns:
          int32 scalar, the number of transitions inserted (n), after they are stored.

        Raises:
          ValueError: if a key is missing.
        """
        missing = [key for key in FIELDS if key not in transitions]
        if missing:
            raise ValueError(f"ReplayMemory.insert: missing key(s) {missing}")
        return self._write(self._cast({key: transitions[key] for key in FIELDS}))

    def _cast(self, fields):
        specs = self._step_specs()
        return {key: tf.cast(value, specs[key][1]) for key, value in fields.items()}

    def _write(self, transitions, emit=None):
        """Writes the candidates with `emit` (bool `[m]`, all when None) to the next rows,
        in order, and the others to the spare row; returns int32 `count`, after."""
        count_static = transitions["reward"].shape[0]
        capacity = self._capacity
        if emit is None and count_static is not None and count_static <= capacity:
            count = tf.constant(count_static, tf.int32)
            rows = (self._position + tf.range(count_static)) % capacity
            priority_rows, keep = rows, None
        else:
            if emit is None:
                emit = tf.ones_like(transitions["reward"], tf.bool)
            emitted = tf.cast(emit, tf.int32)
            offset = tf.cumsum(emitted, exclusive=True)
            count = tf.reduce_sum(emitted)
            keep = emit & (offset >= count - capacity)
            rows = tf.where(keep, (self._position + offset) % capacity, capacity)
            priority_rows = rows
        stored = dict(transitions, **self._observ_storage.encode("observ", transitions["observ"]),
                      **self._observ_storage.encode("nextob", transitions["nextob"]))
        writes = [variable.scatter_nd_update(rows[:, None], stored[key])
                  for key, variable in self.storage.items()]
        if self._prioritized:
            priority = tf.fill(tf.shape(priority_rows), self._max_priority.value())
            if keep is not None:
                priority = tf.where(keep, priority, 0.0)
            writes.append(self.priorities.set(priority_rows, priority))
        writes.append(self._position.assign((self._position + count) % capacity))
        writes.append(self._size.assign(tf.minimum(self._size + count, capacity)))
        with tf.control_dependencies(writes):
            return tf.identity(count)

    def sample(self, batch_size, beta=None):
        """Samples a batch of stored transitions.

        Uniform: indices uniform over `[0, size)` from the memory's generator, weights 1.
        Prioritized (Schaul et al. 2016, sec. 3.3): `P(i) = p_i / sum_k p_k`, stratified, one
        uniform draw in each of `batch_size` equal segments of the total priority (appendix
        B.2.1); importance weights `w_i = (N P(i))^-beta` with N = `size`, normalized by the
        largest weight of this batch (sec. 3.4), so that they are at most 1.

        Args:
          batch_size: int, the number of transitions B.
          beta: float (or float32 scalar tensor) overriding the configured `beta` when not
            None (the algorithm may anneal it to 1); ignored when uniform.

        Returns:
          dict of `observ`, `nextob` `[B, *observ shape]` and `action` `[B, *action shape]`
          in their stored dtypes, float32 `reward`, `discount` and `weight` `[B]`, int32
          `index` `[B]` (the rows, for `update_priorities`).

        Sample only from a non-empty memory: empty, the uniform draw raises
        `tf.errors.InvalidArgumentError` without XLA (its result is unspecified under XLA)
        and the prioritized one gives row 0 with NaN weights.

        Under XLA, within one compiled program, `add` / `insert` / `reset_agents` before
        `sample`, not after: XLA cannot order a write after gathers it does not depend on,
        and copies each written variable whole (docs/throughput.md, "Why the code is as it
        is"). Add-then-sample, also in a `tf.cond` / `tf.while_loop` of updates, copies
        nothing.
        """
        size = self._size.value()
        if not self._prioritized:
            index = self.generator.uniform([batch_size], 0, size, dtype=tf.int32)
            weight = tf.ones([batch_size], tf.float32)
        else:
            index, weight = self._sample_prioritized(batch_size, beta, size)
        rows = {key: tf.gather(variable, index) for key, variable in self.storage.items()}
        batch = {key: self._observ_storage.decode(key, rows) if key in ("observ", "nextob")
                 else rows[key] for key in FIELDS}
        batch["index"] = index
        batch["weight"] = weight
        return batch

    def _sample_prioritized(self, batch_size, beta, size):
        beta = self._prioritized["beta"] if beta is None else beta
        total = self.priorities.total()
        # Uniform in [0, 1) from 24-bit integers: the generator's float path draws other
        # numbers under XLA than on the CPU kernels, its integer path the same ones.
        draws = tf.cast(self.generator.uniform([batch_size], 0, 1 << 24, dtype=tf.int32),
                        tf.float32) * 2.0 ** -24
        targets = (tf.range(batch_size, dtype=tf.float32) + draws) * (total / batch_size)
        index = self.priorities.find(targets)
        probability = self.priorities.get(index) / total
        weight = (tf.cast(size, tf.float32) * probability) ** -tf.cast(beta, tf.float32)
        return index, weight / tf.reduce_max(weight)

    def update_priorities(self, index, td_error):
        """Sets the priorities of sampled transitions, `p = (|td_error| + epsilon)^alpha`
        (Schaul et al. 2016, sec. 3.3, proportional variant) and raises the running largest
        priority, which new transitions get. Does nothing when sampling is uniform.

        Args:
          index: int32 `[B]`, the `index` of a `sample` batch (a repeated index keeps the
            priority of its last occurrence).
          td_error: float32 `[B]`, the TD errors of those transitions.

        Returns:
          float32 scalar, the new total priority (0 when uniform), after the update.
        """
        if not self._prioritized:
            return tf.constant(0.0, tf.float32)
        config = self._prioritized
        priority = (tf.abs(tf.cast(td_error, tf.float32)) + config["epsilon"]) ** \
            config["alpha"]
        total = self.priorities.set(index, priority)
        update = self._max_priority.assign(
            tf.maximum(self._max_priority, tf.reduce_max(priority)))
        with tf.control_dependencies([update]):
            return tf.identity(total)

"""A replay memory of transitions in TensorFlow variables, for the off-policy algorithms.

A ring buffer of `capacity` transitions `(observ, action, reward, discount, nextob)`, filled
one batch step of several agents at a time with n-step returns (Sutton & Barto 2018, sec.
7.1), or with ready transitions from outside, and sampled uniformly or by proportional
prioritization (Schaul et al. 2016, arXiv:1511.05952). All state, the sampling generator
included, lives in the module's variables, so that `tf.train.Checkpoint(memory=memory)` saves
and restores it. Every method is graph code with static shapes: it runs eagerly, inside
`tf.function` and inside `tf.function(jit_compile=True)` (XLA), also within a `tf.while_loop`.

`ReplayMemory` composes three parts that also work apart: the storage
(`batchrl.memories.storage.TransitionStorage`, or for stacked frames kept once
`batchrl.memories.frame_storage.FrameStackStorage`), the n-step accumulator
(`batchrl.memories.n_step.NStepAccumulator`), which hands the transitions it completes to a
writer, and a sampler (`batchrl.memories.samplers`). A learner in another process can own a
storage and a sampler while each actor runs an accumulator whose writer sends transitions
to it.
"""

import numpy as np
import tensorflow as tf

from batchrl.memories.frame_storage import FrameStackStorage
from batchrl.memories.n_step import NStepAccumulator
from batchrl.memories.observation_storage import ObservationStorage
from batchrl.memories.samplers import PRIORITIZED_DEFAULTS, PrioritizedSampler, UniformSampler
from batchrl.memories.storage import FIELDS, TransitionStorage, cast_fields


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


FRAME_STACK_DEFAULTS = {"axis": 0, "window": 4096}  # The window: at most the capacity.
# Sampling uniform over the live slots of a `FrameStackStorage`: every priority 1, weights 1.
_UNIFORM_OVER_SLOTS = {"alpha": 0.0, "beta": 0.0, "epsilon": 1.0}


def _check_frame_stack(frame_stack, capacity):
    """The frame-stack settings with defaults filled in (the default window at most
    `capacity`), or None; ValueError on an unknown or missing key (the values are checked
    by `FrameStackStorage`)."""
    if frame_stack is None:
        return None
    if not isinstance(frame_stack, dict) or "frames" not in frame_stack:
        raise ValueError(f"ReplayMemory: frame_stack must be None or a dict with frames (and "
                         f"optional axis, window), got {frame_stack!r}")
    unknown = sorted(set(frame_stack) - {"frames", *FRAME_STACK_DEFAULTS})
    if unknown:
        raise ValueError(f"ReplayMemory: unknown frame_stack key(s) {unknown}; the keys are "
                         f"{sorted({'frames', *FRAME_STACK_DEFAULTS})}")
    defaults = dict(FRAME_STACK_DEFAULTS, window=min(FRAME_STACK_DEFAULTS["window"], capacity))
    return {**defaults, **frame_stack}


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
    `n_step > 1` each agent has a staging window of its last `n_step - 1` steps (`window`)
    and keeps the observation after its last step (`reset_agents` bootstraps from it).
    When prioritized, `priorities` is the `SumTree` of the rows' priorities; `generator`
    is the sampling's `tf.random.Generator`.
    With `frame_stack`, observations are stacks of uint8 frames kept once each
    (`batchrl.memories.frame_storage.FrameStackStorage`): `storage` holds `frames` and
    `fingerprint` per slot, `observ` and `nextob` as the slots of their frames, and `live`;
    sampling (uniform or prioritized) goes through `priorities` over its slots.

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
      frame_stack: None (whole observations), or a dict of `frames` (int, the frames of a
        stack), `axis` (0 or -1, the stacked axis; default 0) and `window` (int, the slots
        behind a write whose frames it may share; default 4096, or `capacity` if less): uint8
        observations that stack `frames` frames, each frame kept once (`FrameStackStorage`).
      name: name scope of the variables.

    Raises:
      ValueError: if `capacity`, `num_agents` or `n_step` is < 1 or not an int, `discount` is
        outside [0, 1], a spec is not `(shape, dtype)`, `prioritized` has an unknown key or
        a value out of range, `byte_elements` has another shape, or `frame_stack` has an
        unknown key or a value `FrameStackStorage` refuses; the message names the culprit.
    """

    def __init__(self, observ_spec, action_spec, capacity, num_agents, n_step=1, discount=0.99,
                 prioritized=None, seed=0, byte_elements=None, frame_stack=None,
                 name="replay"):
        super().__init__(name=name)
        self._observ_spec = _check_spec(observ_spec, "observ_spec")
        observations = ObservationStorage(*self._observ_spec, byte_elements)
        self._action_spec = _check_spec(action_spec, "action_spec")
        self._capacity = _check_int(capacity, "capacity")
        self._num_agents = _check_int(num_agents, "num_agents")
        self._n_step = _check_int(n_step, "n_step")
        if isinstance(discount, bool) or not 0 <= float(discount) <= 1:
            raise ValueError(f"ReplayMemory: discount must be in [0, 1], got {discount!r}")
        self._discount = float(discount)
        self._prioritized = _check_prioritized(prioritized)
        self._frame_stack = _check_frame_stack(frame_stack, self._capacity)
        # The parts are plain objects; the memory keeps their variables under the attribute
        # names that checkpoints written before the split hold (`replay/storage/observ`,
        # `replay/_size`, `replay/window/observ`, `replay/priorities/tree`, ...).
        with self.name_scope:
            if self._frame_stack:
                self._ring = FrameStackStorage(self._observ_spec, self._action_spec,
                                               self._capacity, **self._frame_stack)
                leaves = self._ring.slots + 1
            else:
                self._ring = TransitionStorage(observations, self._action_spec, self._capacity)
                leaves = self._capacity + 1
            self.storage = self._ring.fields
            self._size = self._ring.size
            self._position = self._ring.position
            self._accumulator = NStepAccumulator(
                self._observ_spec, self._action_spec, self._num_agents, self._n_step,
                self._discount)
            if self._n_step > 1:
                self.window = self._accumulator.window
                self._pending = self._accumulator.pending
                self._last_nextob = self._accumulator.last_nextob
            if self._prioritized or self._frame_stack:
                # One more leaf for the spare row, which always keeps priority 0.
                self._sampler = PrioritizedSampler(
                    leaves, self._prioritized or _UNIFORM_OVER_SLOTS, seed)
                self.priorities = self._sampler.priorities
                self._max_priority = self._sampler.max_priority
            else:
                self._sampler = UniformSampler(seed)
            self.generator = self._sampler.generator

    @property
    def observ_spec(self):
        """`(shape tuple, tf.DType)` of one stored observation."""
        return self._observ_spec

    @property
    def action_spec(self):
        """`(shape tuple, tf.DType)` of one stored action."""
        return self._action_spec

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
    def frame_stack(self):
        """The frame-stack settings (dict `frames`, `axis`, `window`), or None."""
        return dict(self._frame_stack) if self._frame_stack else None

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
        (with `frame_stack`, its share of all slots, `FrameStackStorage.bytes_per_row`)
        and, when prioritized or with `frame_stack`, its share of the sum tree (`2 P`
        float32 entries over `capacity` transitions, rounded up). The spare row, the
        staging windows and the agents' last next observations (a fixed amount per agent)
        are not counted."""
        total = self._ring.bytes_per_row
        if self._prioritized or self._frame_stack:
            total += -(-self.priorities.tree.shape[0] * 4 // self._capacity)
        return total

    def add(self, agent_indices, observ, action, reward, terminated, truncated, nextob):
        """Adds one batch step of the given agents, storing the transitions it completes:
        the n-step returns and the episodes that end at this step are as
        `NStepAccumulator.add` describes (Sutton & Barto 2018, eq. 7.1). The transitions are
        written in the order of `agent_indices`, each agent's oldest first; if there are
        more than `capacity` of them only the last are kept.

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
        return self._accumulator.add(agent_indices, observ, action, reward, terminated,
                                     truncated, nextob, self._write)

    def reset_agents(self, agent_indices):
        """Ends the episodes of these agents after their last step without a termination
        (a new episode began without the old one ending, e.g. a forced reset): their
        waiting steps are stored as transitions of a truncated episode, bootstrapping from
        the `nextob` `add` was last given for the agent (`NStepAccumulator.flush`).

        Args:
          agent_indices: int32 `[n]`, distinct agents in `[0, num_agents)`.

        Returns:
          int32 scalar, the number of transitions inserted, after they are stored.
        """
        return self._accumulator.flush(agent_indices, self._write)

    def insert(self, transitions, td_error=None):
        """Writes ready transitions as they are (e.g. external one-step transitions, or the
        n-step transitions an Ape-X actor made).

        Args:
          transitions: dict with `observ` and `nextob` `[n, *observ shape]`, `action`
            `[n, *action shape]` (cast to the stored dtypes), `reward` and `discount` float32
            `[n]` (`discount` multiplies the value of `nextob`: 0 at a termination). Other
            keys are ignored.
          td_error: None, or float32 `[n]`: with prioritized replay, the transitions' first
            priorities are `(|td_error| + epsilon)^alpha` (`PrioritizedSampler.added`)
            instead of the largest priority so far; ignored when sampling is uniform.

        Returns:
          int32 scalar, the number of transitions inserted (n), after they are stored.

        Raises:
          ValueError: if a key is missing.
        """
        missing = [key for key in FIELDS if key not in transitions]
        if missing:
            raise ValueError(f"ReplayMemory.insert: missing key(s) {missing}")
        return self._write(cast_fields({key: transitions[key] for key in FIELDS},
                                       self._ring.specs), td_error=td_error)

    def _write(self, transitions, emit=None, td_error=None):
        """The memory's writer (`batchrl.memories.n_step`): stores the candidates with `emit`
        (bool `[m]`, all when None) in the next rows, in order, with the sampler's priority
        for new rows (from `td_error` float32 `[m]` when given); returns int32 `count`,
        after."""
        count, rows, keep = self._ring.write(transitions, emit)
        if td_error is not None and self._frame_stack:  # The guard's slots follow the rows.
            td_error = tf.pad(td_error, [[0, tf.shape(rows)[0] - tf.shape(td_error)[0]]])
        with tf.control_dependencies([count] + self._sampler.added(rows, keep, td_error)):
            return tf.identity(count)

    def sample(self, batch_size, beta=None):
        """Samples a batch of stored transitions.

        Uniform: indices uniform over `[0, size)` from the memory's generator, weights 1
        (with `frame_stack`: stratified over the live slots, each of priority 1).
        Prioritized (Schaul et al. 2016, sec. 3.3): `P(i) = p_i / sum_k p_k`, stratified, one
        uniform draw in each of `batch_size` equal segments of the total priority (appendix
        B.2.1); importance weights `w_i = (N P(i))^-beta` with N = `size`, normalized by the
        largest weight of this batch (sec. 3.4), so that they are at most 1
        (`batchrl.memories.samplers`).

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
        index, weight = self._sampler.sample(batch_size, self._size.value(), beta)
        batch = self._ring.gather(index)
        batch["index"] = index
        batch["weight"] = weight
        return batch

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
        return self._sampler.update(index, td_error)

"""A replay memory's storage for observations that are stacks of frames (Atari's last 4
screens): each frame is kept once, and a transition holds the slots of the frames of its
`observ` and `nextob` stacks.

A transition of whole stacks keeps `2 k` frames (k stacked), though consecutive steps of an
episode share `k - 1` of them and a transition's `nextob` shares frames with its `observ`;
here a step adds about one new frame. Frames are shared by content, not by the order of
steps: a write compares each frame of its transitions with the frames of its own
transitions and of the last `window` slots written (by a fingerprint, then pixel by pixel),
so it needs no agent indices and makes no assumption about how an environment fills a stack
at a reset; it works the same for the steps of `ReplayMemory.add` and for the ready
transitions of `ReplayMemory.insert` (an Ape-X actor's).

Frames and transitions share one ring of `slots`: a write puts its new frames and its
transitions in the slots from `position` on and advances it past both. A transition
refers to frames at most `2 window` slots behind its own, so the `2 window` slots ahead of
`position` (the guard) are kept out of sampling: a transition leaves the memory before any
frame it reads is overwritten.
"""

import math

import numpy as np
import tensorflow as tf

from batchrl.memories.storage import FIELDS, transition_specs

AXES = (0, -1)  # The stack's axis: first ([k c, ...], EnvPool's Atari) or last ([..., k c]).


class FrameStackStorage:
    """`capacity` transitions of `frames`-frame stacks, each frame kept once.

    Non-trainable variables of `slots + 1` rows (`slots = capacity + 2 window`; the last
    row is spare, it takes the writes of candidates that are not stored), created in the
    caller's name scope (the module that owns them tracks them for checkpoints,
    `ReplayMemory`), in `fields`:
      `frames`: `[slots + 1, *frame_shape]`, one frame a slot (uint8).
      `fingerprint`: int64 `[slots + 1]`, a hash of each slot's frame (-1: none yet).
      `observ`, `nextob`: int32 `[slots + 1, frames]`, the slots of a transition's stacks'
        frames, oldest first.
      `action`, `reward`, `discount`: as `TransitionStorage` keeps them.
      `live`: bool `[slots + 1]`, the slots holding a transition that may be sampled.
    `size` (int32 scalar) counts the live transitions (at most `capacity`); `position`
    (int32 scalar) is the slot the next write begins at.

    A sampler must give the slots `write` returns their priorities: the transitions written
    get theirs, the slots that enter the guard get 0 (`keep` False), so that only live
    slots are drawn.

    Args:
      observ_spec: `(shape tuple, tf.DType)` of one observation: uint8, `frames` stacks of
        frames of `c` channels on the first axis (`[frames * c, ...]`) or the last
        (`[..., frames * c]`).
      action_spec: `(shape tuple, tf.DType)` of one action, stored in this dtype.
      capacity: int >= 1, the number of transitions kept.
      frames: int >= 1, the frames of a stack (k).
      axis: 0 or -1, the stacked axis.
      window: int in [1, capacity], the slots behind `position` whose frames a write may
        share; a write may take at most `window` slots (its new frames, or its transitions
        if more).

    Raises:
      ValueError: the observation is not uint8, `axis` is not 0 or -1, `frames` or
        `window` is not an int >= 1, `window` exceeds `capacity`, or the stacked axis is
        not a multiple of `frames`.
    """

    def __init__(self, observ_spec, action_spec, capacity, frames, axis=0, window=4096):
        shape, dtype = tuple(int(size) for size in observ_spec[0]), tf.as_dtype(observ_spec[1])
        for name, value in (("frames", frames), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                    value < 1:
                raise ValueError(f"FrameStackStorage: {name} must be an int >= 1, got "
                                 f"{value!r}")
        if window > capacity:
            raise ValueError(f"FrameStackStorage: window ({window}) must be at most the "
                             f"capacity ({capacity})")
        if axis not in AXES:
            raise ValueError(f"FrameStackStorage: axis must be 0 or -1, got {axis!r}")
        if dtype != tf.uint8:
            raise ValueError(f"FrameStackStorage: stacks of uint8 frames only, got {dtype.name}"
                             f" observations")
        if not shape or shape[axis] % frames:
            raise ValueError(f"FrameStackStorage: the observation's axis {axis} (shape "
                             f"{shape}) is not a multiple of {frames} frames")
        channels = shape[axis] // frames
        self._frames, self._axis = int(frames), axis
        self._frame_shape = ((channels,) + shape[1:] if axis == 0 else
                             shape[:-1] + (channels,))
        self._specs = transition_specs((shape, dtype), action_spec)
        self._capacity = int(capacity)
        self._window = int(window)
        self._guard = 2 * self._window
        self._slots = self._capacity + self._guard
        # The fingerprint is a sum of the frame's 4-byte words times random weights, exact
        # in int64: 31 bits a word and log2(words) bits of sum leave the weights the rest.
        self._pixels = math.prod(self._frame_shape)  # The bytes of a frame.
        words = -(-self._pixels // 4)
        bits = 62 - 31 - max(words - 1, 1).bit_length()
        self._weights = tf.constant(np.random.default_rng(0).integers(
            0, 1 << bits, words, dtype=np.int64))
        rows = self._slots + 1
        action_shape, action_dtype = self._specs["action"]
        specs = {"frames": (self._frame_shape, tf.uint8), "fingerprint": ((), tf.int64),
                 "observ": ((self._frames,), tf.int32), "action": (action_shape, action_dtype),
                 "reward": ((), tf.float32), "discount": ((), tf.float32),
                 "nextob": ((self._frames,), tf.int32), "live": ((), tf.bool)}
        self._field_specs = specs
        initial = {key: tf.zeros((rows,) + shape, dtype) for key, (shape, dtype) in
                   specs.items()}
        initial["fingerprint"] = tf.fill([rows], tf.constant(-1, tf.int64))  # No frame yet.
        self.fields = {key: tf.Variable(value, trainable=False, name=key)
                       for key, value in initial.items()}
        self.size = tf.Variable(0, dtype=tf.int32, trainable=False, name="size")
        self.position = tf.Variable(0, dtype=tf.int32, trainable=False, name="position")

    @property
    def capacity(self):
        """int, the number of transitions kept."""
        return self._capacity

    @property
    def slots(self):
        """int, the slots of the ring (`capacity + 2 window`); the sampler's leaves are
        `slots + 1` (the spare one always 0)."""
        return self._slots

    @property
    def specs(self):
        """dict of `FIELDS` to `(shape, dtype)` of one transition as `write` takes it."""
        return dict(self._specs)

    def field_specs(self):
        """dict of the names of `fields` to `(shape, dtype)` of one slot."""
        return dict(self._field_specs)

    @property
    def bytes_per_row(self):
        """int, the bytes of all `fields` over `capacity` (rounded up): a transition's share
        when every slot holds one frame and one transition."""
        total = sum(dtype.size * math.prod(shape) for shape, dtype in
                    self._field_specs.values()) * (self._slots + 1)
        return -(-total // self._capacity)

    def _split(self, observ):
        """`[m, *observ shape]` stacks -> `[m * k, *frame_shape]` frames, each stack's
        oldest first."""
        k, channels = self._frames, self._frame_shape[self._axis]
        if self._axis == 0:
            return tf.reshape(observ, (-1,) + self._frame_shape)
        rest = self._frame_shape[:-1]
        stacked = tf.reshape(observ, (-1,) + rest + (k, channels))
        moved = tf.transpose(stacked, [0, len(rest) + 1] + list(range(1, len(rest) + 1)) +
                             [len(rest) + 2])
        return tf.reshape(moved, (-1,) + self._frame_shape)

    def _join(self, frames):
        """`[B, k, *frame_shape]` -> `[B, *observ shape]`, the inverse of `_split`."""
        observ_shape = self._specs["observ"][0]
        if self._axis == 0:
            return tf.reshape(frames, (-1,) + observ_shape)
        rest = len(self._frame_shape) - 1
        moved = tf.transpose(frames, [0] + list(range(2, rest + 2)) + [1, rest + 2])
        return tf.reshape(moved, (-1,) + observ_shape)

    def _fingerprint(self, flat):
        """int64 `[n]`, the sums of the 4-byte words (int32) of frames `flat` (uint8 `[n,
        pixels]`) times the fixed weights, exact: a quarter of the products of a sum over
        pixels."""
        if self._pixels % 4:
            flat = tf.pad(flat, [[0, 0], [0, -self._pixels % 4]])
        words = tf.bitcast(tf.reshape(flat, [-1, self._weights.shape[0], 4]), tf.int32)
        return tf.reduce_sum(tf.cast(words, tf.int64) * self._weights, -1)

    def _place(self, frames, usable):
        """The slots of candidate frames: a frame equal to one of the last `window` slots'
        or to an earlier candidate takes its slot, any other gets a new slot from
        `position` on, in order.

        Args:
          frames: uint8 `[n, *frame_shape]`.
          usable: bool `[n]`, the candidates to place (the others get the spare slot).

        Returns:
          `(slot, new, count, keys)`: int32 `[n]` slots, bool `[n]` the frames to write
          there, int32 scalar the number of new frames, int64 `[n]` the fingerprints.
        """
        window, slots = self._window, self._slots
        n = tf.shape(usable)[0]
        index = tf.range(n)
        near = (self.position - window + tf.range(window)) % slots
        stored = self.fields["frames"]
        flat = tf.reshape(frames, [n, self._pixels])
        # Candidates left out get keys of their own (< -1); slots without a frame hold -1.
        fingerprints = self._fingerprint(flat)
        keys = tf.concat([tf.gather(self.fields["fingerprint"], near),
                          tf.where(usable, fingerprints, -2 - tf.cast(index, tf.int64))], 0)
        order = tf.argsort(keys, stable=True)  # The slots first among equal keys.
        ordered = tf.gather(keys, order)
        starts = tf.concat([[True], ordered[1:] != ordered[:-1]], 0)
        run = tf.cumsum(tf.cast(starts, tf.int32)) - 1
        total = window + n
        first = tf.math.unsorted_segment_min(tf.range(total), run, total)
        sharer = tf.scatter_nd(order[:, None], tf.gather(order, tf.gather(first, run)),
                               [total])[window:]  # For each candidate: the first of its key.
        own = sharer == window + index
        in_window = sharer < window
        near_slot = tf.gather(near, tf.minimum(sharer, window - 1))
        other = tf.where(in_window[:, None], tf.reshape(tf.gather(stored, near_slot),
                                                        [n, self._pixels]),
                         tf.gather(flat, tf.maximum(sharer - window, 0)))
        same = tf.reduce_all(tf.equal(other, flat), -1)  # Equal fingerprints, other frames.
        new = usable & (own | ~same)
        new_slot = (self.position + tf.cumsum(tf.cast(new, tf.int32), exclusive=True)) % slots
        slot = tf.where(new, new_slot, tf.where(
            in_window, near_slot, tf.gather(new_slot, tf.maximum(sharer - window, 0))))
        slot = tf.where(usable, slot, slots)
        return slot, new, tf.reduce_sum(tf.cast(new, tf.int32)), fingerprints

    def write(self, transitions, emit=None):
        """Writes the candidate transitions with `emit` and their new frames to the next
        slots, and takes the slots entering the guard out of sampling.

        Args:
          transitions: dict of `FIELDS`, `[m, *shape]` in the dtypes of `specs`.
          emit: bool `[m]`, the candidates to store; None: all of them.

        Returns:
          `(count, rows, keep)`: int32 scalar, the number of transitions emitted, after
          every variable is written; int32 `[m + r]`, the slots whose priorities change:
          the slot of each candidate (the spare slot for those not emitted) and r slots
          entering the guard, or the spare one; bool `[m + r]`, True for the emitted
          candidates' slots, which the sampler gives their first priorities, False for the
          others, which get 0.

        Raises:
          tf.errors.InvalidArgumentError: the write needs more than `window` slots (not
            checked under XLA, which drops assertions).
        """
        k, slots = self._frames, self._slots
        if emit is None:
            emit = tf.ones_like(transitions["reward"], tf.bool)
        m = tf.shape(emit)[0]
        frames = tf.concat([self._split(transitions["observ"]),
                            self._split(transitions["nextob"])], 0)
        usable = tf.tile(tf.repeat(emit, k), [2])
        slot, new, added, fingerprints = self._place(frames, usable)
        emitted = tf.cast(emit, tf.int32)
        count = tf.reduce_sum(emitted)
        advance = tf.maximum(added, count)
        check = tf.debugging.assert_less_equal(
            advance, self._window, message=f"FrameStackStorage: a write needs more slots "
            f"than its window of {self._window}: raise replay_frame_stack's window")
        rows = tf.where(emit, (self.position + tf.cumsum(emitted, exclusive=True)) % slots,
                        slots)
        steps = tf.range(2 * k * m)
        retired = tf.where(steps < advance, (self.position + self._guard + steps) % slots,
                           slots)
        live = self.fields["live"]
        leaving = tf.reduce_sum(tf.cast(tf.gather(live, retired), tf.int32))
        frame_slots = tf.where(new, slot, slots)[:, None]
        stacks = tf.reshape(slot, [2, m, k])
        stored = {"observ": stacks[0], "nextob": stacks[1], "action": transitions["action"],
                  "reward": transitions["reward"], "discount": transitions["discount"]}
        with tf.control_dependencies([check, leaving]):
            writes = [self.fields["frames"].scatter_nd_update(frame_slots, frames),
                      self.fields["fingerprint"].scatter_nd_update(frame_slots, fingerprints),
                      live.scatter_nd_update(retired[:, None], tf.zeros_like(retired, tf.bool))]
            writes += [self.fields[key].scatter_nd_update(rows[:, None], value)
                       for key, value in stored.items()]
        with tf.control_dependencies(writes):
            writes = [live.scatter_nd_update(rows[:, None], emit),
                      self.position.assign((self.position + advance) % slots),
                      self.size.assign(self.size + count - leaving)]
        with tf.control_dependencies(writes):
            return (tf.identity(count), tf.concat([rows, retired], 0),
                    tf.concat([emit, tf.zeros_like(retired, tf.bool)], 0))

    def gather(self, index):
        """The transitions of slots `index` (int32 `[B]`): dict of `FIELDS`, `[B, *shape]`
        in the dtypes of `specs`, the stacks joined from their frames."""
        rows = {key: tf.gather(self.fields[key], index) for key in FIELDS}
        for key in ("observ", "nextob"):
            rows[key] = self._join(tf.gather(self.fields["frames"], rows[key]))
        return rows

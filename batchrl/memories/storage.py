"""The ring buffer a replay memory keeps its transitions in: TensorFlow variables of a fixed
number of rows over the fields of a transition, written in order, the oldest overwritten
first."""

import math

import tensorflow as tf

FIELDS = ("observ", "action", "reward", "discount", "nextob")


def transition_specs(observ_spec, action_spec):
    """`(shape, dtype)` of each of `FIELDS` in one transition, from those of one observation
    and one action (`(shape tuple, tf.DType)` each): `reward` and `discount` are float32
    scalars, `nextob` is like `observ`."""
    scalar = ((), tf.float32)
    return {"observ": observ_spec, "action": action_spec, "reward": scalar,
            "discount": scalar, "nextob": observ_spec}


def cast_fields(fields, specs):
    """`fields` (dict of tensors, a subset of `specs`' keys) cast to the dtypes of `specs`."""
    return {key: tf.cast(value, specs[key][1]) for key, value in fields.items()}


class TransitionStorage:
    """`capacity` transitions in non-trainable variables of `capacity + 1` rows each.

    The last row is spare: it takes the writes of candidates that are not stored, so that
    every write has a static shape. The variables, created in the caller's name scope (the
    module that owns them tracks them for checkpoints, e.g. `ReplayMemory`):
      `fields`: dict of `FIELDS` to their variables, `[capacity + 1, *shape]` in the stored
        dtype; `observ` and `nextob` as `observations` keeps them (with byte elements, an
        `observ_bytes` and a `nextob_bytes` uint8 variable too, and `observ` and `nextob`
        left out when every element is a byte).
      `size`: int32 scalar, the number of stored transitions (at most `capacity`).
      `position`: int32 scalar, the row the next transition is written to.
    `reward` holds the k-step return, `discount` the factor of the value of `nextob`
    (`discount^k`, or 0 after a termination).

    Args:
      observations: a `batchrl.memories.observation_storage.ObservationStorage`, how one
        observation is kept.
      action_spec: `(shape tuple, tf.DType)` of one action, stored in this dtype.
      capacity: int >= 1, the number of transitions kept (checked by the caller).
    """

    def __init__(self, observations, action_spec, capacity):
        self._observations = observations
        self._specs = transition_specs((observations.shape, observations.dtype), action_spec)
        self._capacity = capacity
        rows = capacity + 1
        self.fields = {
            key: tf.Variable(tf.zeros((rows,) + shape, dtype), trainable=False, name=key)
            for key, (shape, dtype) in self.field_specs().items()}
        self.size = tf.Variable(0, dtype=tf.int32, trainable=False, name="size")
        self.position = tf.Variable(0, dtype=tf.int32, trainable=False, name="position")

    @property
    def capacity(self):
        """int, the number of transitions kept."""
        return self._capacity

    @property
    def specs(self):
        """dict of `FIELDS` to `(shape, dtype)` of one transition as `write` takes it."""
        return dict(self._specs)

    def field_specs(self):
        """dict of the names of `fields` to `(shape, dtype)` of one row."""
        specs, observations = self._specs, self._observations
        return {**observations.specs("observ"), "action": specs["action"],
                "reward": specs["reward"], "discount": specs["discount"],
                **observations.specs("nextob")}

    @property
    def bytes_per_row(self):
        """int, the bytes of one row over all `fields`."""
        return sum(dtype.size * math.prod(shape) for shape, dtype in
                   self.field_specs().values())

    def write(self, transitions, emit=None):
        """Writes the candidate transitions with `emit` to the next rows, in order, and the
        others to the spare row; if more than `capacity` are emitted only the last are kept.

        Args:
          transitions: dict of `FIELDS`, `[m, *shape]` in the dtypes of `specs`.
          emit: bool `[m]`, the candidates to store; None: all of them.

        Returns:
          `(count, rows, keep)`: int32 scalar, the number of transitions emitted, after
          every variable is written; int32 `[m]`, the row each candidate went to (`capacity`,
          the spare row, for those not kept); bool `[m]`, the candidates kept, or None when
          all are (no `emit` and at most `capacity` candidates, known when tracing).
        """
        count_static = transitions["reward"].shape[0]
        capacity = self._capacity
        if emit is None and count_static is not None and count_static <= capacity:
            count = tf.constant(count_static, tf.int32)
            rows = (self.position + tf.range(count_static)) % capacity
            keep = None
        else:
            if emit is None:
                emit = tf.ones_like(transitions["reward"], tf.bool)
            emitted = tf.cast(emit, tf.int32)
            offset = tf.cumsum(emitted, exclusive=True)
            count = tf.reduce_sum(emitted)
            keep = emit & (offset >= count - capacity)
            rows = tf.where(keep, (self.position + offset) % capacity, capacity)
        observations = self._observations
        stored = dict(transitions, **observations.encode("observ", transitions["observ"]),
                      **observations.encode("nextob", transitions["nextob"]))
        writes = [variable.scatter_nd_update(rows[:, None], stored[key])
                  for key, variable in self.fields.items()]
        writes.append(self.position.assign((self.position + count) % capacity))
        writes.append(self.size.assign(tf.minimum(self.size + count, capacity)))
        with tf.control_dependencies(writes):
            return tf.identity(count), rows, keep

    def gather(self, index):
        """The transitions of rows `index` (int32 `[B]`): dict of `FIELDS`, `[B, *shape]` in
        the dtypes of `specs` (observations joined again from their fields)."""
        rows = {key: tf.gather(variable, index) for key, variable in self.fields.items()}
        return {key: self._observations.decode(key, rows) if key in ("observ", "nextob")
                else rows[key] for key in FIELDS}

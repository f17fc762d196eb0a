"""Fixed-size storage of whole episodes in TensorFlow variables."""

import tensorflow as tf


class EpisodeMemory(tf.Module):
    """Stores up to `capacity` episodes of up to `max_length` steps each, in variables.

    Each row holds one episode: for every field a variable `[capacity, max_length, *shape]`
    and the row's current length in `length`, int32 `[capacity]`. Steps beyond a row's
    length are left as they are and must be masked by the reader.

    Args:
      template: dict mapping field names to `(shape, dtype)` of one step.
      capacity: number of rows (episodes).
      max_length: maximal number of steps of an episode.
      name: name scope of the variables.
    """

    def __init__(self, template, capacity, max_length, name="memory"):
        super().__init__(name=name)
        self._capacity = capacity
        self._max_length = max_length
        self._fields = {}
        with self.name_scope:
            for key, (shape, dtype) in template.items():
                self._fields[key] = tf.Variable(
                    tf.zeros((capacity, max_length) + tuple(shape), dtype), trainable=False,
                    name=key)
            self._length = tf.Variable(tf.zeros([capacity], tf.int32), trainable=False,
                                       name="length")

    @property
    def capacity(self):
        """int, the number of rows (episodes)."""
        return self._capacity

    @property
    def max_length(self):
        """int, the number of steps a row holds."""
        return self._max_length

    @property
    def fields(self):
        """dict of the field variables, `[capacity, max_length, *shape]` each."""
        return dict(self._fields)

    @property
    def length(self):
        """int32 `[capacity]`, the number of steps stored in each row."""
        return self._length

    def append(self, transitions, rows):
        """Appends one step to each of the given rows.

        Args:
          transitions: dict of tensors `[len(rows), *shape]`, one entry per field.
          rows: int32 `[n]` row indices.

        Returns:
          The op (a tensor) after which the step is stored.

        Raises:
          tf.errors.InvalidArgumentError (when run): if a row is already full.
        """
        rows = tf.cast(rows, tf.int32)
        length = tf.gather(self._length, rows)
        check = tf.debugging.assert_less(
            length, self._max_length,
            message=f"{self.name}: an episode is longer than max_length={self._max_length}")
        with tf.control_dependencies([check]):
            index = tf.stack([rows, length], 1)
        writes = [self._fields[key].scatter_nd_update(index, transitions[key])
                  for key in self._fields]
        with tf.control_dependencies(writes):
            return self._length.scatter_nd_add(rows[:, None], tf.ones_like(rows))

    def replace(self, episodes, length, rows):
        """Overwrites whole rows.

        Args:
          episodes: dict of tensors `[len(rows), max_length, *shape]`, one entry per field.
          length: int32 `[len(rows)]`, the number of valid steps of each episode.
          rows: int32 `[n]` row indices.

        Returns:
          The op (a tensor) after which the episodes are stored.
        """
        rows = tf.cast(rows, tf.int32)[:, None]
        writes = [self._fields[key].scatter_nd_update(rows, episodes[key])
                  for key in self._fields]
        with tf.control_dependencies(writes):
            return self._length.scatter_nd_update(rows, tf.cast(length, tf.int32))

    def data(self, rows=None):
        """Returns `(episodes, length)` of the given rows (all when None)."""
        if rows is None:
            return {key: tf.identity(var) for key, var in self._fields.items()}, \
                tf.identity(self._length)
        rows = tf.cast(rows, tf.int32)
        episodes = {key: tf.gather(var, rows) for key, var in self._fields.items()}
        return episodes, tf.gather(self._length, rows)

    def clear(self, rows=None):
        """Sets the length of the given rows (all when None) to zero; returns the op."""
        if rows is None:
            return self._length.assign(tf.zeros_like(self._length))
        rows = tf.cast(rows, tf.int32)[:, None]
        return self._length.scatter_nd_update(rows, tf.zeros_like(rows[:, 0]))

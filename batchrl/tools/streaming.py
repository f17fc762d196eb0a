"""Running statistics kept in TensorFlow variables, updated from batches inside the graph.

`StreamingMean` averages a stream of batches (used for episode scores and lengths).
`StreamingNormalize` keeps a running mean and variance and normalizes values with them
(used for observations and rewards, as in Heess et al., arXiv:1707.02286, and in
Hafner et al., arXiv:1709.02878).

The statistics are combined batch by batch with the parallel update of Chan, Golub and
LeVeque, "Algorithms for computing the sample variance" (1979): for two sets with counts
n_a, n_b, means m_a, m_b and sums of squared deviations M_a, M_b,

    n = n_a + n_b,  delta = m_b - m_a,
    m = m_a + delta * n_b / n,
    M = M_a + M_b + delta^2 * n_a * n_b / n.

Both classes are `tf.Module`s, so `tf.train.Checkpoint` saves and restores their state.
"""

import numpy as np
import tensorflow as tf

from batchrl.tools import summaries


class StreamingMean(tf.Module):
    """Mean of a stream of batches of values.

    Args:
      shape: shape of one value (the batch dimension excluded).
      dtype: float dtype of the values and of the mean.
      name: name scope of the variables.
    """

    def __init__(self, shape=(), dtype=tf.float32, name="streaming_mean"):
        super().__init__(name=name)
        self._shape = tuple(shape)
        with self.name_scope:
            self._sum = tf.Variable(tf.zeros(self._shape, dtype), trainable=False, name="sum")
            self._count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")

    @property
    def count(self):
        """Number of values submitted since the last `clear`, int64 scalar."""
        return self._count.read_value()

    @property
    def value(self):
        """Mean of the values submitted since the last `clear` (zeros when there were none)."""
        count = tf.cast(tf.maximum(self._count, 1), self._sum.dtype)
        return self._sum / count

    def submit(self, values):
        """Adds a batch of values.

        Args:
          values: tensor of shape `[batch, *shape]`; the batch may be empty.

        Returns:
          The op (a tensor) that updates the statistics.
        """
        values = tf.convert_to_tensor(values, self._sum.dtype)
        update_sum = self._sum.assign_add(tf.reduce_sum(values, 0))
        update_count = self._count.assign_add(tf.shape(values, out_type=tf.int64)[0])
        with tf.control_dependencies([update_sum, update_count]):
            return tf.identity(self._count)

    def clear(self):
        """Returns the current mean and resets the statistics."""
        mean = self.value
        with tf.control_dependencies([mean]):
            reset_sum = self._sum.assign(tf.zeros_like(self._sum))
            reset_count = self._count.assign(0)
        with tf.control_dependencies([reset_sum, reset_count]):
            return tf.identity(mean)


class StreamingNormalize(tf.Module):
    """Normalizes values with a running mean and standard deviation.

    `transform(x) = clip((x - mean) / (std + 1e-8), -clip, clip)`, where the centering is
    done only with `center=True`, the scaling only with `scale=True` and once at least two
    values were seen, and the clipping only when `clip` is set. With a `mask`, only the
    elements where it is True are transformed; the others pass unchanged (e.g. the one-hot
    elements of a flattened nested observation). The statistics are stored in float64 so
    that long streams do not lose precision; they are kept for all elements.

    Args:
      shape: shape of one value (the batch dimension excluded).
      center: subtract the running mean.
      scale: divide by the running standard deviation (unbiased, n - 1 in the denominator).
      clip: bound of the normalized values, or None.
      mask: optional bool array of `shape`, the elements to transform; None: all.
      name: name scope of the variables.

    Raises:
      ValueError: if `clip` is not positive, or `mask` does not have the shape `shape`.
    """

    def __init__(self, shape, center=True, scale=True, clip=None, mask=None,
                 name="normalize"):
        super().__init__(name=name)
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be positive or None, got {clip}")
        self._shape = tuple(shape)
        if mask is not None and tuple(np.shape(mask)) != self._shape:
            raise ValueError(f"mask of shape {np.shape(mask)}, expected {self._shape}")
        self._mask = None if mask is None else np.asarray(mask, bool)
        self._center = center
        self._scale = scale
        self._clip = clip
        with self.name_scope:
            self._count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")
            self._mean = tf.Variable(
                tf.zeros(self._shape, tf.float64), trainable=False, name="mean")
            self._var_sum = tf.Variable(
                tf.zeros(self._shape, tf.float64), trainable=False, name="var_sum")

    @property
    def count(self):
        """Number of values seen, int64 scalar."""
        return self._count.read_value()

    @property
    def mean(self):
        """Running mean, float32 of `shape`."""
        return tf.cast(self._mean, tf.float32)

    @property
    def std(self):
        """Running standard deviation, float32 of `shape` (ones before two values were seen)."""
        count = tf.cast(self._count, tf.float64)
        variance = self._var_sum / tf.maximum(count - 1.0, 1.0)
        std = tf.where(count > 1.0, tf.sqrt(variance), tf.ones_like(variance))
        return tf.cast(std, tf.float32)

    def update(self, values, all_reduce=None):
        """Adds a batch of values to the statistics.

        Args:
          values: tensor of shape `[batch, *shape]`; the batch may be empty.
          all_reduce: None, or an object whose `sum(tensor, name)` sums a float64 tensor
            over processes that make the same call (`batchrl.distributed.collective.AllReduce`):
            then the batch added is the union of every process's `values` (their count,
            mean and sum of squared deviations from the union's mean, in two sums), so
            that the processes' statistics stay equal.

        Returns:
          The op (a tensor) that updates the statistics.

        Raises:
          tf.errors.InvalidArgumentError (when run): if a value is NaN or infinite.
        """
        values = tf.cast(values, tf.float64)
        values = tf.debugging.assert_all_finite(values, f"{self.name}: non-finite value")
        batch_count = tf.shape(values, out_type=tf.int64)[0]
        batch_size = tf.cast(batch_count, tf.float64)
        total = tf.reduce_sum(values, 0)
        if all_reduce is not None:  # The union of every process's batch.
            summed = all_reduce.sum(tf.concat([batch_size[None], tf.reshape(total, [-1])], 0),
                                    f"{self.name}/sums")
            batch_size = summed[0]
            batch_count = tf.cast(batch_size, tf.int64)
            total = tf.reshape(summed[1:], tf.shape(total))
        batch_mean = total / tf.maximum(batch_size, 1.0)
        batch_var_sum = tf.reduce_sum(tf.square(values - batch_mean), 0)
        if all_reduce is not None:
            batch_var_sum = all_reduce.sum(batch_var_sum, f"{self.name}/deviations")
        old_count = tf.cast(self._count, tf.float64)
        new_count = old_count + batch_size
        delta = batch_mean - self._mean
        ratio = batch_size / tf.maximum(new_count, 1.0)
        new_mean = self._mean + delta * ratio
        new_var_sum = self._var_sum + batch_var_sum + tf.square(delta) * old_count * ratio
        with tf.control_dependencies([new_mean, new_var_sum]):
            ops = [
                self._mean.assign(new_mean),
                self._var_sum.assign(new_var_sum),
                self._count.assign_add(batch_count),
            ]
        with tf.control_dependencies(ops):
            return tf.identity(self._count)

    def transform(self, values):
        """Normalizes values with the current statistics.

        Args:
          values: float tensor whose trailing dimensions equal `shape`.

        Returns:
          float32 tensor of the same shape.
        """
        values = tf.cast(values, tf.float32)
        normalized = values
        if self._center:
            normalized -= self.mean
        if self._scale:
            normalized /= self.std + 1e-8
        if self._clip is not None:
            normalized = tf.clip_by_value(normalized, -self._clip, self._clip)
        if self._mask is not None:
            normalized = tf.where(self._mask, normalized, values)
        return normalized

    def inverse(self, values):
        """Maps normalized values back with the current statistics: `x * (std + 1e-8) +
        mean`, each part only where `transform` applies it (and only at `mask`); the
        inverse of `transform` for values inside its clipping range.

        Args:
          values: float tensor whose trailing dimensions equal `shape`.

        Returns:
          float32 tensor of the same shape.
        """
        values = tf.cast(values, tf.float32)
        restored = values
        if self._scale:
            restored *= self.std + 1e-8
        if self._center:
            restored += self.mean
        if self._mask is not None:
            restored = tf.where(self._mask, restored, values)
        return restored

    def reset(self):
        """Forgets all values seen; returns the op."""
        ops = [
            self._count.assign(0),
            self._mean.assign(tf.zeros_like(self._mean)),
            self._var_sum.assign(tf.zeros_like(self._var_sum)),
        ]
        with tf.control_dependencies(ops):
            return tf.identity(self._count)

    def summary(self):
        """Writes histograms `NAME/mean` and `NAME/std` to the default writer."""
        with tf.name_scope(f"{self.name}/"):
            summaries.histogram("mean", self.mean)
            summaries.histogram("std", self.std)

"""How a replay memory picks the rows of a batch: uniformly, or in proportion to priorities
(Schaul et al. 2016, "Prioritized Experience Replay", arXiv:1511.05952) with importance
weights whose exponent beta anneals to 1.

A sampler draws row indices and weights; the rows themselves are read from a
`batchrl.memories.storage.TransitionStorage`. Its variables (the random generator and, when
prioritized, the sum tree and the running largest priority) are created in the caller's name
scope and tracked for checkpoints by the module that owns them (`ReplayMemory`).
"""

import tensorflow as tf

from batchrl.memories.sum_tree import SumTree

PRIORITIZED_DEFAULTS = {"alpha": 0.6, "beta": 0.4, "epsilon": 1e-6}


class UniformSampler:
    """Rows uniform over the stored ones, every weight 1.

    Args:
      seed: int, seed of the sampler's own `tf.random.Generator` (`generator`).
    """

    def __init__(self, seed):
        self.generator = tf.random.Generator.from_seed(seed)

    def sample(self, batch_size, size, beta=None):
        """`(index, weight)`: int32 `[B]` uniform over `[0, size)` (`size` an int32 scalar,
        the stored rows) and float32 `[B]` ones; `beta` is ignored."""
        del beta
        index = self.generator.uniform([batch_size], 0, size, dtype=tf.int32)
        return index, tf.ones([batch_size], tf.float32)

    def added(self, rows, keep, td_error=None):
        """Nothing to note of rows just written (see `PrioritizedSampler.added`); returns
        an empty list of operations."""
        del rows, keep, td_error
        return []

    def update(self, index, td_error):
        """Nothing to update; returns float32 0 (the total priority of no priorities)."""
        del index, td_error
        return tf.constant(0.0, tf.float32)


class PrioritizedSampler:
    """Proportional prioritization (Schaul et al. 2016, sec. 3.3) over the rows of a storage.

    The variables: `priorities`, a `SumTree` of one leaf per row (named `priorities`),
    `max_priority`, float32 scalar, the largest priority so far, which rows just written get
    (1 at first), and `generator`, the sampler's own `tf.random.Generator`.

    Args:
      rows: int, the number of rows of the storage (its spare row included: its leaf keeps
        priority 0).
      settings: dict of `alpha`, `beta`, `epsilon` (floats, checked by the caller; defaults
        `PRIORITIZED_DEFAULTS`).
      seed: int, seed of `generator`.
    """

    def __init__(self, rows, settings, seed):
        self._settings = dict(settings)
        self.priorities = SumTree(rows, name="priorities")
        self.max_priority = tf.Variable(1.0, trainable=False, name="max_priority")
        self.generator = tf.random.Generator.from_seed(seed)

    def sample(self, batch_size, size, beta=None):
        """Stratified proportional sampling: `P(i) = p_i / sum_k p_k`, one uniform draw in
        each of `batch_size` equal segments of the total priority (appendix B.2.1);
        importance weights `w_i = (N P(i))^-beta` with N = `size`, normalized by the largest
        weight of this batch (sec. 3.4), so that they are at most 1.

        Args:
          batch_size: int B.
          size: int32 scalar, the number of stored rows N.
          beta: float or float32 scalar overriding the settings' `beta`; None: theirs.

        Returns:
          `(index, weight)`: int32 `[B]` rows and float32 `[B]` weights.
        """
        beta = self._settings["beta"] if beta is None else beta
        total = self.priorities.total()
        # Uniform in [0, 1) from 24-bit integers: the generator's float path draws other
        # numbers under XLA than on the CPU kernels, its integer path the same ones.
        draws = tf.cast(self.generator.uniform([batch_size], 0, 1 << 24, dtype=tf.int32),
                        tf.float32) * 2.0 ** -24
        targets = (tf.range(batch_size, dtype=tf.float32) + draws) * (total / batch_size)
        index, priority, total = self.priorities.find(targets, with_values=True)
        probability = priority / total
        weight = (tf.cast(size, tf.float32) * probability) ** -tf.cast(beta, tf.float32)
        return index, weight / tf.reduce_max(weight)

    def added(self, rows, keep, td_error=None):
        """Gives rows just written their first priority: the largest priority so far, or,
        given their TD errors (computed where the transitions were made, as Ape-X's actors
        do: Horgan et al. 2018, arXiv:1803.00933, sec. 3), `(|td_error| + epsilon)^alpha`,
        which also raises the running largest priority. Rows not kept get 0.

        Args:
          rows: int32 `[m]`, the rows written (`TransitionStorage.write`).
          keep: bool `[m]`, the candidates kept, or None when all were.
          td_error: None, or float32 `[m]`, the candidates' TD errors.

        Returns:
          A list of the operations to wait for.
        """
        if td_error is None:
            priority = tf.fill(tf.shape(rows), self.max_priority.value())
        else:
            priority = self._priority(td_error)
        if keep is not None:
            priority = tf.where(keep, priority, 0.0)
        updates = [] if td_error is None else [self.max_priority.assign(
            tf.maximum(self.max_priority, tf.reduce_max(priority)))]
        with tf.control_dependencies(updates):
            return [self.priorities.set(rows, priority)]

    def _priority(self, td_error):
        """`(|td_error| + epsilon)^alpha` (sec. 3.3, proportional variant), float32."""
        settings = self._settings
        return (tf.abs(tf.cast(td_error, tf.float32)) + settings["epsilon"]) ** \
            settings["alpha"]

    def update(self, index, td_error):
        """Sets the priorities of sampled rows, `p = (|td_error| + epsilon)^alpha` (sec. 3.3,
        proportional variant), and raises the running largest priority.

        Args:
          index: int32 `[B]`, sampled rows (a repeated row keeps its last priority).
          td_error: float32 `[B]`, their TD errors.

        Returns:
          float32 scalar, the new total priority, after the update.
        """
        priority = self._priority(td_error)
        total = self.priorities.set(index, priority)
        update = self.max_priority.assign(
            tf.maximum(self.max_priority, tf.reduce_max(priority)))
        with tf.control_dependencies([update]):
            return tf.identity(total)


def annealed_beta(beta, step, steps):
    """The importance-sampling exponent at `step`: `beta + (1 - beta) min(step / steps, 1)`,
    linear from `beta` (float) to 1 over `steps` (int > 0) and 1 from there (Schaul et al.
    2016, sec. 3.4); `step` a scalar tensor or number; float32 scalar."""
    fraction = tf.minimum(tf.cast(step, tf.float32) / float(steps), 1.0)
    return beta + (1.0 - beta) * fraction

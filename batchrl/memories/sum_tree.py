"""An in-graph sum tree over priorities, for proportional prioritized replay.

Schaul et al. 2016, "Prioritized Experience Replay" (arXiv:1511.05952), sec. 3.3 and appendix
B.2.1: every inner node holds the sum of its children, so that the total is the root, a leaf
is found from a prefix sum by one descent, and a leaf is changed by recomputing its
ancestors. Here a node has `2^k` children (`levels_per_step` k, 4 by default): the descent
and the update take `log2(P) / k` steps of one gather each. All methods are graph code
with static shapes: they run eagerly, inside `tf.function` and inside
`tf.function(jit_compile=True)` (XLA).
"""

import tensorflow as tf


class SumTree(tf.Module):
    """A sum tree over `capacity` non-negative float32 leaves, all 0 at first.

    The tree is one float32 variable `tree` of `2 * P` entries, `P` the next power of two
    at least `capacity`, laid out as a binary tree: node `k` has the children `2k` and
    `2k + 1`, the root is node 1, entry 0 is unused and leaf `i` is node `P + i`; the leaves
    `[capacity, P)` stay 0. Only every `levels_per_step`-th level (`summed_levels`, counted
    up from the leaves, and the root) is kept: a node there holds the sum of its `2^k`
    descendants on the next kept level below, so that `find` descends `k` levels and `set`
    climbs `k` levels at a time.

    Args:
      capacity: int >= 1, the number of leaves.
      levels_per_step: int >= 1, the levels `find` descends at once (`2^k` children).
      name: name scope of the variable.

    Raises:
      ValueError: if `capacity` or `levels_per_step` is not an int >= 1.
    """

    def __init__(self, capacity, levels_per_step=4, name="sum_tree"):
        super().__init__(name=name)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"SumTree: capacity must be an int >= 1, got {capacity!r}")
        if isinstance(levels_per_step, bool) or not isinstance(levels_per_step, int) or \
                levels_per_step < 1:
            raise ValueError(f"SumTree: levels_per_step must be an int >= 1, got "
                             f"{levels_per_step!r}")
        self._capacity = capacity
        self._levels_per_step = levels_per_step
        self._depth = max(capacity - 1, 0).bit_length()
        self._leaves = 1 << self._depth
        with self.name_scope:
            self.tree = tf.Variable(tf.zeros([2 * self._leaves], tf.float32), trainable=False,
                                    name="tree")

    @property
    def capacity(self):
        """int, the number of leaves."""
        return self._capacity

    @property
    def depth(self):
        """int, the number of levels below the root, `log2 P`."""
        return self._depth

    def total(self):
        """float32 scalar, the sum of all leaves (the root).

        A gather, not a slice: a dense read of a variable that was scattered to copies it
        whole (TensorFlow's copy-on-read mode for sparsely accessed variables).
        """
        return tf.gather(self.tree, 1)

    def get(self, indices):
        """float32 `[n]`, the values of the leaves `indices` (int32 `[n]` in
        `[0, capacity)`)."""
        return tf.gather(self.tree, tf.cast(indices, tf.int32) + self._leaves)

    def set(self, indices, values):
        """Sets the leaves `indices` to `values`, then recomputes their ancestors on the
        levels a descent reads (`summed_levels`).

        Each such ancestor is recomputed from its `2^k` descendants on the next summed level
        below (not by adding a difference), so rounding errors do not accumulate, the sums
        are the same with and without XLA, and duplicated indices are fine: the leaf keeps
        the last value given for it (the indices are sorted first, equal ones in their
        order; see `_sorted`) and its ancestors the sums of what the leaves hold. With
        `levels_per_step` 4, a tree of 2^17 leaves takes 5 gathers and scatters instead of
        17 (docs/throughput.md).

        Args:
          indices: int32 `[n]` leaf indices in `[0, capacity)`.
          values: float32 `[n]`, non-negative.

        Returns:
          The root after the update (float32 scalar), a tensor to wait for.
        """
        indices, values = _sorted(tf.cast(indices, tf.int32), tf.cast(values, tf.float32))
        nodes = indices + self._leaves
        update = self.tree.scatter_nd_update(nodes[:, None], values)
        for levels in reversed(self._steps()):
            width = 1 << levels
            with tf.control_dependencies([update]):
                nodes = nodes // width
                children = tf.gather(self.tree, nodes[:, None] * width + tf.range(width)[None])
            update = self.tree.scatter_nd_update(nodes[:, None], tf.reduce_sum(children, 1))
        with tf.control_dependencies([update]):
            return self.total()

    @property
    def summed_levels(self):
        """list of ints, the levels (0 the root, `depth` the leaves) whose nodes hold the sum
        of their descendants on the next such level: those a descent from the root reads.
        The nodes of other levels are not kept (they stay 0)."""
        levels = [0]
        for step in self._steps():
            levels.append(levels[-1] + step)
        return levels

    def _steps(self):
        """The levels of each step of a descent from the root: `depth` split into steps of
        `levels_per_step`, the remainder first."""
        full, first = divmod(self._depth, self._levels_per_step)
        return ([first] if first else []) + [self._levels_per_step] * full

    def find(self, targets, with_values=False):
        """Leaf indices by prefix sums: leaf `i` with `sum(leaves[:i]) <= target <
        sum(leaves[:i + 1])`, found by descending from the root (Schaul et al. 2016,
        appendix B.2.1).

        The descent goes down `levels_per_step` levels at a time: the `2^k` descendants
        `k` levels below a node are contiguous, so one gather and a cumulative sum pick the
        next node (fewer, larger operations than one level at a time). It never enters a
        subtree of sum 0: where rounding would step past the last nonzero leaf (a target at
        or above the total) it takes that leaf, a target below 0 gives the first nonzero
        leaf, and when the total is 0 it returns 0.

        Args:
          targets: float32 `[n]`, prefix sums, normally in `[0, total())`.
          with_values: also return the leaves' values and the total, as the descent's
            gathers read them (under XLA a `get` or `total` beside `find` is one more read
            of the tree, which a `set` that does not depend on it makes XLA copy the tree
            for).

        Returns:
          int32 `[n]` leaf indices in `[0, capacity)`; with `with_values`, `(indices,
          values, total)`: float32 `[n]` the leaves' values and float32 scalar the sum of
          the root's children.
        """
        targets = tf.maximum(tf.cast(targets, tf.float32), 0.0)
        nodes = tf.ones_like(targets, tf.int32)
        total = None
        for levels in self._steps():
            width = 1 << levels
            first = nodes * width
            values = tf.gather(self.tree, first[:, None] + tf.range(width)[None])
            if total is None:
                total = tf.reduce_sum(values[0])
            prefix = tf.cumsum(values, axis=1)
            passed = tf.reduce_sum(tf.cast(prefix <= targets[:, None], tf.int32), 1)
            last = tf.reduce_max(tf.where(values > 0, tf.range(width)[None], 0), 1)
            choice = tf.minimum(passed, last)
            below = tf.gather(prefix, choice, batch_dims=1) - tf.gather(
                values, choice, batch_dims=1)
            targets = tf.maximum(targets - below, 0.0)
            nodes = first + choice
        indices = tf.minimum(nodes - self._leaves, self._capacity - 1)
        if not with_values:
            return indices
        if total is None:  # One leaf, the root.
            return indices, self.get(indices), self.total()
        return indices, tf.gather(values, choice, batch_dims=1), total



def _sorted(indices, values):
    """`indices` sorted, equal ones in their given order, and `values` in the same order.

    The sort also keeps XLA from copying the whole tree: indices computed from values read
    from the tree (`find`) would otherwise be fused into the index computations of the
    scatters, which would then read the tree while it is being written; the sort's output
    is a buffer of its own.
    """
    count = tf.shape(indices, out_type=tf.int64)[0]
    keys = tf.sort(tf.cast(indices, tf.int64) * count + tf.range(count))
    return tf.cast(keys // count, tf.int32), tf.gather(values, keys % count)

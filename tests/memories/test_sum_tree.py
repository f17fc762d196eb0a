"""The in-graph sum tree against NumPy prefix sums, eagerly and under XLA."""

import re

import numpy as np
import pytest
import tensorflow as tf

from batchrl.memories.sum_tree import SumTree


def _reference_find(leaves, targets):
    """The leaf i with cumsum(<i) <= target < cumsum(<=i) (zero leaves are never chosen)."""
    return np.searchsorted(np.cumsum(leaves), targets, side="right")


def _check_inner_nodes(tree, levels_per_step=4):
    """Every node of a kept level holds the sum of the leaves below it: the kept levels are
    the root and every `levels_per_step`-th level up from the leaves."""
    values = tree.tree.numpy().astype(np.float64)
    leaves = values[len(values) // 2:]
    depth = tree.depth
    kept = [0] + list(range(depth % levels_per_step or levels_per_step, depth + 1,
                            levels_per_step))
    assert tree.summed_levels == kept
    for level in kept[:-1]:
        nodes = values[1 << level:2 << level]
        np.testing.assert_allclose(nodes, leaves.reshape(len(nodes), -1).sum(1), rtol=1e-6)


@pytest.mark.parametrize("capacity, levels_per_step", [(13, 4), (13, 1), (64, 4), (300, 3),
                                                       (1, 4), (2, 4)])
def test_set_find_total_match_numpy(capacity, levels_per_step):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity, levels_per_step=levels_per_step)
    leaves = np.zeros(capacity, np.float32)
    for _ in range(4):
        # Integer values: float32 sums are exact, so the boundaries must match exactly.
        indices = rng.choice(capacity, size=rng.integers(1, capacity + 1), replace=False)
        values = rng.integers(0, 5, size=len(indices)).astype(np.float32)
        values[0] = 3.0  # Never an all-zero tree.
        tree.set(indices.astype(np.int32), values)
        leaves[indices] = values
        assert tree.total().numpy() == leaves.sum()
        np.testing.assert_array_equal(tree.get(np.arange(capacity, dtype=np.int32)), leaves)
        prefix = np.cumsum(leaves)
        targets = np.concatenate([prefix[:-1], prefix - 0.5, rng.uniform(0, prefix[-1], 50)])
        targets = targets[(targets >= 0) & (targets < prefix[-1])].astype(np.float32)
        found = tree.find(targets).numpy()
        np.testing.assert_array_equal(found, _reference_find(leaves, targets))
        assert np.all(leaves[found] > 0)
        _check_inner_nodes(tree, levels_per_step)
        with_values = tree.find(targets, with_values=True)
        np.testing.assert_array_equal(with_values[0], found)
        np.testing.assert_array_equal(with_values[1], leaves[found])
        assert with_values[2].numpy() == leaves.sum()


def test_duplicates_in_set_last_write_wins():
    tree = SumTree(10)
    tree.set(np.arange(10, dtype=np.int32), np.ones(10, np.float32))
    tree.set(np.array([3, 5, 3, 3], np.int32), np.array([1.0, 2.0, 7.0, 4.0], np.float32))
    expected = np.ones(10, np.float32)
    expected[5], expected[3] = 2.0, 4.0
    np.testing.assert_array_equal(tree.get(np.arange(10, dtype=np.int32)), expected)
    assert tree.total().numpy() == expected.sum()
    _check_inner_nodes(tree)


def test_find_clamps_to_last_nonzero_leaf_and_skips_zero_leaves():
    tree = SumTree(6)
    tree.set(np.arange(6, dtype=np.int32), np.array([0, 2, 0, 1, 0, 0], np.float32))
    found = tree.find(np.array([-1.0, 0.0, 1.99, 2.0, 2.999, 3.0, 1e9], np.float32)).numpy()
    np.testing.assert_array_equal(found, [1, 1, 1, 3, 3, 3, 3])
    empty = SumTree(6)
    np.testing.assert_array_equal(empty.find(np.array([0.0, 1.0], np.float32)), [0, 0])


def test_float_values_find_within_rounding():
    rng = np.random.default_rng(1)
    capacity = 1000
    tree = SumTree(capacity)
    leaves = rng.uniform(0.01, 1, capacity).astype(np.float32)
    tree.set(np.arange(capacity, dtype=np.int32), leaves)
    np.testing.assert_allclose(tree.total(), leaves.astype(np.float64).sum(), rtol=1e-5)
    targets = rng.uniform(0, leaves.sum(), 500).astype(np.float32)
    found = tree.find(targets).numpy()
    reference = _reference_find(leaves.astype(np.float64), targets.astype(np.float64))
    # Rounding may move a target lying within 1e-3 of a boundary to the neighbouring leaf.
    assert np.all(np.abs(found - reference) <= 1)
    assert np.mean(found == reference) > 0.99
    prefix = np.cumsum(leaves.astype(np.float64))
    lower = np.concatenate([[0.0], prefix])[found]
    assert np.all((lower - 1e-3 <= targets) & (targets < prefix[found] + 1e-3))


def test_jit_matches_eager():
    rng = np.random.default_rng(2)
    eager, compiled = SumTree(37), SumTree(37)
    set_jit = tf.function(compiled.set, jit_compile=True)
    find_jit = tf.function(compiled.find, jit_compile=True)
    for _ in range(3):
        indices = rng.integers(0, 37, 20).astype(np.int32)
        values = rng.uniform(0, 2, 20).astype(np.float32)
        eager.set(indices, values)
        set_jit(tf.constant(indices), tf.constant(values))
        np.testing.assert_array_equal(eager.tree.numpy(), compiled.tree.numpy())
        targets = rng.uniform(0, eager.total().numpy(), 64).astype(np.float32)
        np.testing.assert_array_equal(eager.find(targets), find_jit(tf.constant(targets)))


@pytest.mark.parametrize("capacity, levels", [(0, 4), (2.5, 4), (True, 4), (4, 0)])
def test_bad_arguments_raise(capacity, levels):
    with pytest.raises(ValueError, match="capacity" if levels else "levels_per_step"):
        SumTree(capacity, levels_per_step=levels)


@pytest.mark.parametrize("indices_of", ["root", "find"])
def test_xla_set_with_indices_read_from_the_tree_does_not_copy_it(indices_of):
    # Cheap index arithmetic on values read from the tree would be fused into every level's
    # scatter, which would then read the tree while writing it: XLA copies it whole per level
    # unless the indices are materialized (sorted) first.
    tree = SumTree(1000)
    tree.set(np.arange(1000, dtype=np.int32), np.ones(1000, np.float32))

    @tf.function(jit_compile=True)
    def set_from_tree(targets):
        if indices_of == "root":
            indices = tf.cast(targets, tf.int32) + tf.cast(tree.total(), tf.int32) - 1000
        else:
            indices = (tree.find(targets) + 1) % 1000
        return tree.set(indices, tf.fill(tf.shape(targets), 2.0))

    targets = tf.constant([3.5, 7.5, 3.5], tf.float32)
    hlo = set_from_tree.experimental_get_compiler_ir(targets)(stage="optimized_hlo")
    assert not re.findall(r"f32\[2048\]\{0\} copy\(", hlo)
    set_from_tree(targets)
    expected = np.ones(1000, np.float32)
    expected[[4, 8] if indices_of == "find" else [3, 7]] = 2.0
    np.testing.assert_array_equal(tree.get(np.arange(1000, dtype=np.int32)), expected)
    assert tree.total().numpy() == expected.sum()

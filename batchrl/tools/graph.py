"""Ordering in graph code: values that are ready only once given operations ran."""

import tensorflow as tf


def after(dependencies, values):
    """`values` (a nested structure of tensors), computed after `dependencies`.

    Args:
      dependencies: a nested structure of tensors or operations; None entries (what an
        algorithm method may return) are ignored.
      values: a nested structure of tensors.

    Returns:
      `values` through `tf.identity`, each with control dependencies on `dependencies`.
    """
    ops = [d for d in tf.nest.flatten(dependencies) if d is not None]
    with tf.control_dependencies(ops):
        return tf.nest.map_structure(tf.identity, values)

"""The interface of batchrl's optimizers, and the vector arithmetic on lists of variables
that they share."""

import tensorflow as tf

from batchrl.optimizers import fused_adam


class Optimizer(tf.Module):
    """An update rule usable inside `tf.function` (and eagerly).

    `minimize(loss_fn, variables, kl_fn=None)` changes `variables` and returns
    `(deltas, diagnostics)`: the change made to each variable (a list of tensors of the
    variables' shapes) and a dict of float32 scalars. `loss_fn` and `kl_fn` take no
    arguments and return float32 scalars computed from the current values of the
    variables; they may be called several times. `kl_fn` is the mean KL divergence from
    the policy before the update to the policy the variables give now (zero before any
    change); optimizers that do not need it ignore it.

    Optimizers are `tf.Module`s: a `tf.train.Checkpoint` holding one holds its state
    (e.g. Adam's moments). Call `build(variables)` outside of any `tf.function` before the
    first `minimize`, so that such state exists before tracing.
    """

    def build(self, variables):
        """Creates the optimizer's state for `variables` (a list of `tf.Variable`s)."""
        del variables

    def minimize(self, loss_fn, variables, kl_fn=None):
        """One update; returns `(deltas, diagnostics)` as the class docstring says."""
        raise NotImplementedError

    def scale_learning_rate(self, scale):
        """Sets the learning rate to `scale` (float32 scalar) times the configured one, for
        schedules; returns the assignments (none for rules without a learning rate)."""
        del scale
        return []


class Wrapper(Optimizer):
    """An optimizer around another one (`self.optimizer`), which it builds and whose
    learning rate it schedules."""

    def __init__(self, optimizer, name=None):
        super().__init__(name=name)
        self.optimizer = optimizer

    def build(self, variables):
        self.optimizer.build(variables)

    def scale_learning_rate(self, scale):
        return self.optimizer.scale_learning_rate(scale)


def flatten(tensors):
    """The tensors (a list; None counts as zeros of no size) as one float32 vector."""
    return tf.concat([tf.reshape(tensor, [-1]) for tensor in tensors], 0)


def unflatten(vector, variables):
    """Splits `vector` into tensors of the shapes of `variables`; the inverse of `flatten`."""
    sizes = [variable.shape.num_elements() for variable in variables]
    parts = tf.split(vector, sizes)
    return [tf.reshape(part, variable.shape)
            for part, variable in zip(parts, variables, strict=True)]


def gradients(tape, value, variables):
    """`tape.gradient(value, variables)`, zeros for variables that `value` does not use."""
    # Not UnconnectedGradients.ZERO: it fails on Keras 3 variables (their dtype is a string).
    gradients = tape.gradient(value, variables)
    return [tf.zeros(variable.shape, tf.as_dtype(variable.dtype)) if gradient is None
            else gradient for gradient, variable in zip(gradients, variables, strict=True)]


def apply_clipped(optimizer, gradients, variables, max_norm=None):
    """One step of a Keras optimizer on `gradients`, clipped to the global norm `max_norm`
(a plain Adam runs as fused kernels: `fused_adam`).

    The gradients (one per variable, as one vector) keep their direction and are scaled
    by `max_norm / norm` when their global norm `norm` exceeds `max_norm`
    (`tf.clip_by_global_norm`; Pascanu et al. 2013, arXiv:1211.5063, algorithm 2).

    Args:
      optimizer: a `keras.optimizers.Optimizer`.
      gradients: list of tensors of the variables' shapes (None entries count as zero in
        the norm and are passed on as None).
      variables: list of `tf.Variable`s.
      max_norm: float > 0, or None / 0 for no clipping.

    Returns:
      `(applied, norm)`: the optimizer's `apply_gradients` result (to wait for) and the
      float32 scalar global norm of `gradients` before clipping.
    """
    norm = tf.linalg.global_norm(gradients)
    if max_norm:
        gradients, _ = tf.clip_by_global_norm(gradients, max_norm, use_norm=norm)
    if fused_adam.can_fuse(optimizer, variables):
        applied = fused_adam.apply(optimizer, gradients, variables)
    else:
        applied = optimizer.apply_gradients(zip(gradients, variables, strict=True))
    return applied, norm


def dot(first, second):
    """The inner product of two lists of tensors of equal shapes; float32 scalar."""
    return tf.add_n([tf.reduce_sum(a * b) for a, b in zip(first, second, strict=True)])


def read(variables):
    """The current values of `variables`, read now (a list of tensors)."""
    return [tf.identity(variable) for variable in variables]


def assign(variables, values):
    """Sets each variable to its value; returns a float32 scalar that is ready once all are
    set, to wait for (control dependencies)."""
    assigned = [variable.assign(value)
                for variable, value in zip(variables, values, strict=True)]
    with tf.control_dependencies(assigned):
        return tf.constant(0.0)

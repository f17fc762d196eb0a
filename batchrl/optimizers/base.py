"""The interface of batchrl's optimizers, and the vector arithmetic on lists of variables
that they share."""

import tensorflow as tf


class Optimizer(tf.Module):
    """An update rule usable inside `tf.function` (and eagerly).

    `minimize(loss_fn, variables, kl_fn=None)` changes `variables` and returns
    `(deltas, diagnostics)`: the change made to each variable (a list of tensors of the
    variables' shapes) and a dict of float32 scalars. `loss_fn` and `kl_fn` take no
    arguments and return float32 scalars computed from the current values of the
    variables; they may be called several times. `kl_fn` is the mean KL divergence from
    the policy before the update to the policy the variables give now (zero before any
    change); optimizers that do not need it ignore it.

    `apply(gradients, variables)` takes one step on gradients computed by the caller
    (e.g. an algorithm with several losses, each with its own optimizer) and returns the
    diagnostics only; rules whose step needs the loss itself (the natural gradient, the
    line search and the wrappers) raise NotImplementedError there, and say so with
    `steps_on_gradients` False.

    Optimizers are `tf.Module`s: a `tf.train.Checkpoint` holding one holds its state
    (e.g. Adam's moments). Call `build(variables)` outside of any `tf.function` before the
    first `minimize` or `apply`, so that such state exists before tracing.

    Attributes:
      steps_on_gradients: bool, `apply` takes a step (False: only `minimize` does).
    """

    steps_on_gradients = False

    def build(self, variables):
        """Creates the optimizer's state for `variables` (a list of `tf.Variable`s)."""
        del variables

    def minimize(self, loss_fn, variables, kl_fn=None):
        """One update; returns `(deltas, diagnostics)` as the class docstring says."""
        raise NotImplementedError

    def apply(self, gradients, variables):
        """One step on given gradients.

        Args:
          gradients: list of float32 tensors of the variables' shapes, one per variable
            (None: no gradient for that variable).
          variables: list of the `tf.Variable`s the optimizer was built for (`build`).

        Returns:
          dict of float32 scalars, each computed after the variables have changed (to wait
          for the step).

        Raises:
          NotImplementedError: a rule whose step needs the loss (use `minimize`).
        """
        del gradients, variables
        raise NotImplementedError(
            f"{type(self).__name__} cannot step on given gradients; use minimize")

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

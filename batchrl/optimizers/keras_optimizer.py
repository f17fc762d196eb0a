"""Keras' first-order optimizers (Adam, SGD, RMSprop) behind batchrl's optimizer interface."""

import keras
import tensorflow as tf

from batchrl.optimizers import base


class KerasOptimizer(base.Optimizer):
    """One step of a Keras optimizer on the gradient of the loss.

    Args:
      optimizer: a `keras.optimizers.Optimizer` whose learning rate is a float (it becomes
        a variable, which `scale_learning_rate` sets).
      max_gradient_norm: clip the gradient to this global norm first (None: no clipping).

    `minimize` returns the diagnostics `loss` (before the step) and `gradient_norm` (the
    global norm before clipping).
    """

    def __init__(self, optimizer, max_gradient_norm=None, name=None):
        super().__init__(name=name)
        self.optimizer = optimizer
        self._learning_rate = float(optimizer.learning_rate.numpy())
        self._max_gradient_norm = max_gradient_norm

    def build(self, variables):
        self.optimizer.build(list(variables))

    def minimize(self, loss_fn, variables, kl_fn=None):
        del kl_fn
        with tf.GradientTape() as tape:
            loss = loss_fn()
        gradients = base.gradients(tape, loss, variables)
        before = base.read(variables)
        with tf.control_dependencies(before):
            applied, norm = base.apply_clipped(
                self.optimizer, gradients, variables, self._max_gradient_norm)
        with tf.control_dependencies([applied]):
            deltas = [variable - start for variable, start in zip(variables, before, strict=True)]
        return deltas, {"loss": loss, "gradient_norm": norm}

    def scale_learning_rate(self, scale):
        return [self.optimizer.learning_rate.assign(self._learning_rate * scale)]


def adam(learning_rate, **options):
    """Keras' Adam at `learning_rate` (a float; it becomes a variable, which learning rate
    schedules set) with Keras' keyword arguments `options`: the one way batchrl builds
    Adam (`create`, PPO, the off-policy algorithms)."""
    return keras.optimizers.Adam(float(learning_rate), **options)


def create(kind, learning_rate, max_gradient_norm=None, **options):
    """A `KerasOptimizer` of `kind` (`adam`, `sgd` or `rmsprop`) with Keras' keyword
    arguments `options` (e.g. `beta_1`, `momentum`, `rho`).

    Raises:
      ValueError: unknown `kind`.
    """
    classes = {"adam": adam, "sgd": keras.optimizers.SGD,
               "rmsprop": keras.optimizers.RMSprop}
    if kind not in classes:
        raise ValueError(f"unknown Keras optimizer {kind!r}; choices: {', '.join(classes)}")
    return KerasOptimizer(classes[kind](float(learning_rate), **options), max_gradient_norm,
                          name=kind)

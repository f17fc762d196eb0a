"""Keras' first-order optimizers (Adam, SGD, RMSprop) and batchrl's RAdam (`radam`) behind
batchrl's optimizer interface."""

import keras
import tensorflow as tf

from batchrl.optimizers import base, fused_adam
from batchrl.optimizers.radam import RAdam
from batchrl.tools.graph import after


class KerasOptimizer(base.Optimizer):
    """One step of a Keras optimizer on the gradient of the loss, the gradient clipped to a
    global norm first (a plain Adam runs as fused kernels: `fused_adam`).

    Args:
      optimizer: a `keras.optimizers.Optimizer` whose learning rate is a float (it becomes
        a variable, which `scale_learning_rate` sets).
      max_gradient_norm: clip the gradient to this global norm first (None or 0: no
        clipping).

    `minimize` returns the diagnostics `loss` (before the step) and `gradient_norm` (the
    global norm before clipping); `apply` the latter.
    """

    steps_on_gradients = True

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
            diagnostics = self.apply(gradients, variables)
        with tf.control_dependencies(list(diagnostics.values())):
            deltas = [variable - start for variable, start in zip(variables, before, strict=True)]
        return deltas, {"loss": loss, **diagnostics}

    def apply(self, gradients, variables):
        """One step of the Keras optimizer on `gradients`, clipped to the global norm
        `max_gradient_norm` first when it is set.

        The gradients (one per variable, as one vector) keep their direction and are scaled
        by `max_gradient_norm / norm` when their global norm `norm` exceeds it
        (`tf.clip_by_global_norm`; Pascanu et al. 2013, arXiv:1211.5063, algorithm 2).

        Args:
          gradients: list of float32 tensors of the variables' shapes (None entries count
            as zero in the norm, and leave their variable and its slots unchanged).
          variables: list of the `tf.Variable`s the optimizer was built for.

        Returns:
          `{"gradient_norm": norm}`: the float32 scalar global norm of `gradients` before
          clipping, computed after the step.
        """
        norm = tf.linalg.global_norm(gradients)
        if self._max_gradient_norm:
            gradients, _ = tf.clip_by_global_norm(
                gradients, self._max_gradient_norm, use_norm=norm)
        if fused_adam.can_fuse(self.optimizer, variables):
            applied = fused_adam.apply(self.optimizer, gradients, variables)
        else:
            applied = self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return {"gradient_norm": after([applied], norm)}

    def scale_learning_rate(self, scale):
        return [self.optimizer.learning_rate.assign(self._learning_rate * scale)]


def adam(learning_rate, **options):
    """Keras' Adam at `learning_rate` (a float; it becomes a variable, which learning rate
    schedules set) with Keras' keyword arguments `options`: the one way batchrl builds
    Adam (`create`, hence every algorithm's Adam)."""
    return keras.optimizers.Adam(float(learning_rate), **options)


def create(kind, learning_rate, max_gradient_norm=None, **options):
    """A `KerasOptimizer` of `kind` (`adam`, `radam`, `sgd` or `rmsprop`) with Keras' keyword
    arguments `options` (e.g. `beta_1`, `momentum`, `rho`); `radam` is rectified Adam
    (`batchrl.optimizers.radam`, Liu et al. 2020, arXiv:1908.03265, algorithm 2).

    Raises:
      ValueError: unknown `kind`.
    """
    classes = {"adam": adam, "radam": RAdam, "sgd": keras.optimizers.SGD,
               "rmsprop": keras.optimizers.RMSprop}
    if kind not in classes:
        raise ValueError(f"unknown Keras optimizer {kind!r}; choices: {', '.join(classes)}")
    return KerasOptimizer(classes[kind](float(learning_rate), **options), max_gradient_norm,
                          name=kind)

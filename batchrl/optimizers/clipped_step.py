"""Another optimizer's step, shortened to a largest norm."""

import tensorflow as tf

from batchrl.optimizers import base


class ClippedStep(base.Wrapper):
    """An inner optimizer's step, scaled down to the global norm `max_norm` when longer.

    The step (all variables' changes as one vector) keeps its direction; only its length
    is limited, to |step| <= max_norm (in the units of the variables).

    Args:
      optimizer: the inner `base.Optimizer`.
      max_norm: float > 0.

    `minimize` returns the inner optimizer's diagnostics and `clipped_step/norm`, the norm
    of the inner step before clipping.
    """

    def __init__(self, optimizer, max_norm, name="clipped_step"):
        super().__init__(optimizer, name=name)
        self._max_norm = float(max_norm)

    def minimize(self, loss_fn, variables, kl_fn=None):
        deltas, diagnostics = self.optimizer.minimize(loss_fn, variables, kl_fn)
        norm = tf.linalg.global_norm(deltas)
        keep = tf.minimum(1.0, self._max_norm / tf.maximum(norm, 1e-12))
        # The variables hold the full step: take back the part beyond max_norm.
        taken_back = [variable.assign_sub((1.0 - keep) * delta)
                      for variable, delta in zip(variables, deltas, strict=True)]
        with tf.control_dependencies(taken_back):
            clipped = [keep * delta for delta in deltas]
        return clipped, dict(diagnostics, **{"clipped_step/norm": norm})

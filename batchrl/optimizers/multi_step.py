"""Several consecutive steps of another optimizer, as one update."""

import tensorflow as tf

from batchrl.optimizers import base


class MultiStep(base.Wrapper):
    """`steps` consecutive steps of an inner optimizer on the same loss.

    Each step starts where the previous one ended (the loss and KL functions see the
    variables as they are then); the KL function keeps measuring from the policy before
    the first step. The steps run in a `tf.while_loop`, so the graph holds the inner step
    twice (the first step, traced outside the loop, fixes the diagnostics' structure),
    however many steps there are.

    Args:
      optimizer: the inner `base.Optimizer`.
      steps: int >= 1.

    `minimize` returns the sum of the inner steps' deltas and the diagnostics of the last
    step, with `loss` replaced by the loss before the first one.
    """

    def __init__(self, optimizer, steps, name="multi_step"):
        super().__init__(optimizer, name=name)
        self._steps = int(steps)

    def minimize(self, loss_fn, variables, kl_fn=None):
        deltas, diagnostics = self.optimizer.minimize(loss_fn, variables, kl_fn)
        first_loss = diagnostics.get("loss")

        def body(index, total, diagnostics):
            with tf.control_dependencies(tf.nest.flatten((total, diagnostics))):
                deltas, diagnostics = self.optimizer.minimize(loss_fn, variables, kl_fn)
            return index + 1, [t + d for t, d in zip(total, deltas, strict=True)], diagnostics

        _, total, diagnostics = tf.while_loop(
            lambda index, *_: index < self._steps, body, (tf.constant(1), deltas, diagnostics))
        if first_loss is not None:
            diagnostics = dict(diagnostics, loss=first_loss)
        return total, diagnostics

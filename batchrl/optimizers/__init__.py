"""Optimizer modules usable inside `tf.function`: Keras' Adam, SGD and RMSprop, rectified Adam
(`RAdam`, `radam.py`), the natural gradient, a line search, several steps and a clipped step,
declared in configs and stacked.

Every optimizer has `minimize(loss_fn, variables, kl_fn=None) -> (deltas, diagnostics)`
(`base.Optimizer`); the Keras ones also `apply(gradients, variables) -> diagnostics`, a step
on gradients the caller computed. `create(spec)` builds one from its declaration;
`spec.check` checks a declaration without TensorFlow. Names are imported lazily, so that
checking a config does not start TensorFlow.
"""

from batchrl import _lazy

_EXPORTS = {
    "ClippedStep": "batchrl.optimizers.clipped_step",
    "KerasOptimizer": "batchrl.optimizers.keras_optimizer",
    "LineSearch": "batchrl.optimizers.line_search",
    "MultiStep": "batchrl.optimizers.multi_step",
    "NaturalGradient": "batchrl.optimizers.natural_gradient",
    "Optimizer": "batchrl.optimizers.base",
    "RAdam": "batchrl.optimizers.radam",
    "adam": "batchrl.optimizers.keras_optimizer",
    "conjugate_gradient": "batchrl.optimizers.natural_gradient",
    "create": "batchrl.optimizers.factory",
    "fisher_vector_product": "batchrl.optimizers.natural_gradient",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

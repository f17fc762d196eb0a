"""Graph code helpers: values that are ready only once given operations ran (`after`), and
a `tf.function` called through its traced graph (`TracedCall`)."""

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


class TracedCall:
    """Calls `function`, a `tf.function` with an `input_signature`, through its traced graph
    (its `ConcreteFunction`, traced at the first call), which skips `tf.function`'s binding
    of the arguments to the signature: 0.4 ms of a call of the training loop's step
    function and 0.2 ms of an `Agent.act` here (docs/throughput.md, docs/agent.md). Calls
    `function` itself while functions run eagerly (`tf.config.run_functions_eagerly`),
    which only it honours.

    Attributes:
      function: the `tf.function`.
    """

    def __init__(self, function):
        self.function = function
        self._traced = None

    def __call__(self, *args):
        if tf.config.functions_run_eagerly():
            return self.function(*args)
        if self._traced is None:
            self._traced = self.function.get_concrete_function()
        return self._traced(*args)

    def experimental_get_tracing_count(self):
        """How often `function` was traced (int), as the `tf.function` says."""
        return self.function.experimental_get_tracing_count()

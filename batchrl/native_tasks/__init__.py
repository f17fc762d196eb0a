"""The native tasks: environments written in TensorFlow and stepped inside the graph, so that
a collection step compiles with XLA (`tf.function(jit_compile=True)`); a config names one as
`env: batchrl.native_tasks:Pendulum` (also `CartPole`, `MinAtarBreakout`).

The classes live in `batchrl.environments.native` (`NativeBatchEnv`: what they share); this
is their public name. Their old name, `batchrl.envs`, imports this module itself with a
DeprecationWarning for a release (`batchrl._lazy.moved_modules`). Names are imported lazily
(`batchrl._lazy.exports`): importing this package imports TensorFlow only when a class is
used.
"""

from batchrl import _lazy

_EXPORTS = {name: "batchrl.environments.native"
            for name in ("CartPole", "MinAtarBreakout", "NativeBatchEnv", "Pendulum")}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

"""Small algorithm-agnostic utilities: graph helpers, streaming statistics, summaries and
the mock algorithm.

DESIGN.md's first names stay reachable here: the environments' (`tools.BatchEnv`,
`tools.InGraphBatchEnv`, `tools.MockEnvironment`, `tools.ExternalProcess`), which live in
`batchrl.environments`, and the drivers' (`tools.simulate`, `tools.Loop`), which live in
`batchrl.drivers`. Names are imported lazily (`batchrl._lazy.exports`), so that importing
this package imports no TensorFlow. An exported name is the documented object on every
access, also where a module has the same name (`tools.simulate` is the function); a
submodule is reached by its name (`tools.streaming`).

The modules that moved keep their old paths for a release (`batchrl._lazy.moved_modules`):
`batchrl.tools.simulate`, `.loop`, `.numpy_function`, `.wrappers` and `.nested` import
their new modules.
"""

from batchrl import _lazy

_EXPORTS = {
    "BatchEnv": "batchrl.environments.local",
    "ExternalProcess": "batchrl.environments.wrappers",
    "InGraphBatchEnv": "batchrl.environments.in_graph",
    "Loop": "batchrl.drivers.loop",
    "MockAlgorithm": "batchrl.tools.mock_algorithm",
    "MockEnvironment": "batchrl.environments.mock",
    "StreamingMean": "batchrl.tools.streaming",
    "StreamingNormalize": "batchrl.tools.streaming",
    "simulate": "batchrl.drivers.simulate",
}

__all__ = sorted(_EXPORTS)

_lazy.moved_modules({
    "batchrl.tools.loop": "batchrl.drivers.loop",
    "batchrl.tools.nested": "batchrl.spaces.nested",
    "batchrl.tools.numpy_function": "batchrl.environments.numpy_function",
    "batchrl.tools.simulate": "batchrl.drivers.simulate",
    "batchrl.tools.wrappers": "batchrl.environments.wrappers",
})
__getattr__ = _lazy.exports(__name__, _EXPORTS, submodules=True)

"""Algorithm-agnostic infrastructure: `simulate`, the training loop, streaming statistics
and the mock algorithm. The environments live in `batchrl.environments`; DESIGN.md's names
of them stay reachable here (`tools.BatchEnv`, `tools.InGraphBatchEnv`,
`tools.MockEnvironment`, `tools.ExternalProcess`, `tools.wrappers.ExternalProcess`).

Names are imported lazily, so that importing this package imports no TensorFlow. An
exported name is the documented object on every access, also where a submodule has the
same name
(`tools.simulate` is the function; its module is `sys.modules["batchrl.tools.simulate"]`,
and `from batchrl.tools.simulate import ...` reaches its other names).
"""

import importlib
import sys
import types

_EXPORTS = {
    "BatchEnv": "batchrl.environments.local",
    "ExternalProcess": "batchrl.environments.wrappers",
    "InGraphBatchEnv": "batchrl.environments.in_graph",
    "Loop": "batchrl.tools.loop",
    "MockAlgorithm": "batchrl.tools.mock_algorithm",
    "MockEnvironment": "batchrl.environments.mock",
    "StreamingMean": "batchrl.tools.streaming",
    "StreamingNormalize": "batchrl.tools.streaming",
    "simulate": "batchrl.tools.simulate",
}

__all__ = sorted(_EXPORTS)


class _Package(types.ModuleType):
    """Keeps importing a submodule from replacing an exported name of the same name (the
    import system sets the submodule as an attribute of its package)."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


# Modules that moved to `batchrl.environments`, reachable as attributes under their old name.
_MOVED = {"wrappers": "batchrl.environments.wrappers"}


def __getattr__(name):
    if name in _MOVED:
        return importlib.import_module(_MOVED[name])
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

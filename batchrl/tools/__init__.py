"""Algorithm-agnostic infrastructure: batched environments, the in-graph environment,
`simulate`, streaming statistics and the training loop.

Names are imported lazily so that environment worker processes, which unpickle
constructors that live in this package, never import TensorFlow.
"""

import importlib

_EXPORTS = {
    "BatchEnv": "batchrl.tools.batch_env",
    "ExternalProcess": "batchrl.tools.wrappers",
    "InGraphBatchEnv": "batchrl.tools.in_graph_batch_env",
    "Loop": "batchrl.tools.loop",
    "MockAlgorithm": "batchrl.tools.mock_algorithm",
    "MockEnvironment": "batchrl.tools.mock_environment",
    "StreamingMean": "batchrl.tools.streaming",
    "StreamingNormalize": "batchrl.tools.streaming",
    "simulate": "batchrl.tools.simulate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

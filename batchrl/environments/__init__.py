"""Everything that makes or steps environments (no TensorFlow until an in-graph part is
used): the batch-environment contract (`base.BaseBatchEnv`) and one module per backend
(`local`, `processes`, `envpool`, `ray/`), the in-graph batch (`in_graph`), the in-graph
native environments (`native`, also named `batchrl.envs`), the application's batch of
`batchrl.Agent` (`application`), the test tasks (`mock`, `nested_tasks`), the
environments of a config (`make`: `create_batch`, `episode_limit`, ...), and cheaper
`tf.numpy_function` calls for the in-graph batch (`numpy_function`).

Names are imported lazily, so that worker processes, which unpickle constructors that live
in this package, import only what they use: `environments.BatchEnv` is
`environments.local.BatchEnv`, and the functions of `make` are reached from here too
(`environments.create_batch`).
"""

import importlib

_EXPORTS = {
    "ApplicationBatchEnv": "application",
    "BaseBatchEnv": "base",
    "BatchEnv": "local",
    "EnvPoolBatchEnv": "envpool",
    "ExternalProcess": "wrappers",
    "InGraphBatchEnv": "in_graph",
    "MockEnvironment": "mock",
    "ParallelBatchEnv": "processes",
    "RayBatchEnv": "ray.driver",
    "WorkerBatchEnv": "worker",
}
_SUBMODULES = {"application", "base", "envpool", "in_graph", "local", "make", "mock", "native",
               "nested_tasks", "numpy_function", "process_group", "processes", "ray",
               "worker", "wrappers"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif not name.startswith("__"):
        value = getattr(importlib.import_module(f"{__name__}.make"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

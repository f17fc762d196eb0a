"""Everything that makes or steps environments (no TensorFlow until an in-graph part is
used): the batch-environment contract (`base.BaseBatchEnv`) and one module per backend
(`local`, `processes`, `envpool`, `ray/`), the in-graph batch (`in_graph`), the in-graph
native environments (`native`, also named `batchrl.native_tasks`), the application's batch of
`batchrl.Agent` (`application`), the test tasks (`mock`, `nested_tasks`), the
environments of a config (`make`: `create_batch`, `episode_limit`, ...), and cheaper
`tf.numpy_function` calls for the in-graph batch (`numpy_function`).

Names are imported lazily (`batchrl._lazy.exports`), so that worker processes, which
unpickle constructors that live in this package, import only what they use:
`environments.BatchEnv` is `environments.local.BatchEnv`, the public names of `make` are
reached from here too (`environments.create_batch`), and a submodule by its name
(`environments.native`).
"""

from batchrl import _lazy

_CLASSES = {
    "ApplicationBatchEnv": "batchrl.environments.application",
    "BaseBatchEnv": "batchrl.environments.base",
    "BatchEnv": "batchrl.environments.local",
    "EnvPoolBatchEnv": "batchrl.environments.envpool",
    "ExternalProcess": "batchrl.environments.wrappers",
    "InGraphBatchEnv": "batchrl.environments.in_graph",
    "MockEnvironment": "batchrl.environments.mock",
    "ParallelBatchEnv": "batchrl.environments.processes",
    "RayBatchEnv": "batchrl.environments.ray.driver",
    "WorkerBatchEnv": "batchrl.environments.worker",
}
# The environments of a config (`make`'s public names).
_MAKE = {name: "batchrl.environments.make" for name in (
    "ENVPOOL_PREFIX",
    "check_backend",
    "check_env_id",
    "create",
    "create_batch",
    "envpool_settings",
    "envpool_task",
    "episode_limit",
    "gymnasium_id",
    "native_class",
    "registered_id",
)}

__all__ = sorted(_CLASSES)

__getattr__ = _lazy.exports(__name__, _CLASSES | _MAKE, submodules=True)

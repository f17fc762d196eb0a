"""Nested spaces: `nested` flattens `Dict` / `Tuple` / `Discrete` / `MultiBinary` spaces into
flat vectors and back with NumPy alone (the environments' side, also in worker processes);
`graph` holds the spaces a policy works in and the maps between them and an environment's
spaces inside the graph (`batchrl.Agent`, the exported SavedModel).

The functions of `graph` are exported here by name (`batchrl.spaces.to_action_space`),
imported on first access, so that `import batchrl.spaces.nested` imports no TensorFlow.
"""

from batchrl import _lazy

_EXPORTS = {name: "batchrl.spaces.graph" for name in (
    "observation_dtype",
    "policy_observation_space",
    "policy_action_space",
    "observation_spec",
    "to_policy_observation",
    "to_action_space",
    "from_action_space",
    "named_actions",
)}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

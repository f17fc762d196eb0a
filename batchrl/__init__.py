"""batchrl: batched reinforcement learning in TensorFlow.

`batchrl.Agent` is imported on first access, so that environment worker processes, which
import this package, never import TensorFlow.
"""

from batchrl import _lazy

__version__ = "0.1.0"
__all__ = ["Agent"]

# Moved modules: their old paths stay importable for a release.
_lazy.moved_modules({
    "batchrl.envs": "batchrl.native_tasks",
    "batchrl.network_spec": "batchrl.networks.spec",
    "batchrl.policies": "batchrl.networks.policies",
    "batchrl.torso": "batchrl.networks.torso",
})

__getattr__ = _lazy.exports(__name__, {"Agent": "batchrl.agent"})

"""Learning algorithms that plug into `batchrl.tools.simulate`: BatchPPO, TRPO, A2C, and
`build_algorithm`, which makes an algorithm of a few pure functions.

Names are imported lazily, so that importing the package does not start TensorFlow.
"""

from batchrl import _lazy

_EXPORTS = {
    "A2C": "batchrl.algorithms.a2c",
    "FunctionalAlgorithm": "batchrl.algorithms.builder",
    "OnPolicyAlgorithm": "batchrl.algorithms.on_policy",
    "PPO": "batchrl.algorithms.ppo",
    "TRPO": "batchrl.algorithms.trpo",
    "build_algorithm": "batchrl.algorithms.builder",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

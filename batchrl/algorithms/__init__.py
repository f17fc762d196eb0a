"""Learning algorithms that plug into `batchrl.drivers.simulate`: BatchPPO, TRPO, A2C,
`build_algorithm`, which makes an algorithm of a few pure functions, and the off-policy SAC,
TD3 and DQN with their replay memory.

Names are imported lazily, so that importing the package does not start TensorFlow.
"""

from batchrl import _lazy

_EXPORTS = {
    "A2C": "batchrl.algorithms.a2c",
    "DQN": "batchrl.algorithms.dqn",
    "FunctionalAlgorithm": "batchrl.algorithms.builder",
    "OffPolicyAlgorithm": "batchrl.algorithms.off_policy",
    "OnPolicyAlgorithm": "batchrl.algorithms.on_policy",
    "PPO": "batchrl.algorithms.ppo",
    "ReplayMemory": "batchrl.algorithms.replay",
    "SAC": "batchrl.algorithms.sac",
    "TD3": "batchrl.algorithms.td3",
    "TRPO": "batchrl.algorithms.trpo",
    "build_algorithm": "batchrl.algorithms.builder",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

"""Learning algorithms that plug into `batchrl.drivers.simulate` (subclasses of `Algorithm`,
the contract in code): BatchPPO, TRPO, A2C, IMPALA (V-trace), APPO (PPO on V-trace), PQN
(Q-learning on rollouts), `build_algorithm`, which makes an algorithm of a few pure
functions, and the off-policy SAC, TD3 and DQN, which learn from a replay memory
(`batchrl.memories`).

Names are imported lazily, so that importing the package does not start TensorFlow.
"""

from batchrl import _lazy

_EXPORTS = {
    "A2C": "batchrl.algorithms.a2c",
    "APPO": "batchrl.algorithms.appo",
    "Actor": "batchrl.algorithms.actor",
    "Algorithm": "batchrl.algorithms.base",
    "DQN": "batchrl.algorithms.dqn",
    "FunctionalAlgorithm": "batchrl.algorithms.builder",
    "IMPALA": "batchrl.algorithms.impala",
    "OffPolicyAlgorithm": "batchrl.algorithms.off_policy",
    "OnPolicyAlgorithm": "batchrl.algorithms.on_policy",
    "PPO": "batchrl.algorithms.ppo",
    "PQN": "batchrl.algorithms.pqn",
    "ReplayMemory": "batchrl.memories.replay",
    "SAC": "batchrl.algorithms.sac",
    "TD3": "batchrl.algorithms.td3",
    "TRPO": "batchrl.algorithms.trpo",
    "build_algorithm": "batchrl.algorithms.builder",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

# Moved modules: their old paths stay importable for a release.
_lazy.moved_modules({
    "batchrl.algorithms.distributions": "batchrl.networks.distributions",
    "batchrl.algorithms.memory": "batchrl.memories.episode",
    "batchrl.algorithms.observation_storage": "batchrl.memories.observation_storage",
    "batchrl.algorithms.q_networks": "batchrl.networks.q_networks",
    "batchrl.algorithms.replay": "batchrl.memories.replay",
    "batchrl.algorithms.sum_tree": "batchrl.memories.sum_tree",
})

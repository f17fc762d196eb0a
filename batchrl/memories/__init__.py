"""The memories of experience in TensorFlow variables: the episode memory of the on-policy
algorithms and the replay memory of the off-policy ones, and their parts."""

from batchrl import _lazy

_EXPORTS = {
    "EpisodeMemory": "batchrl.memories.episode",
    "ObservationStorage": "batchrl.memories.observation_storage",
    "ReplayMemory": "batchrl.memories.replay",
    "SumTree": "batchrl.memories.sum_tree",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

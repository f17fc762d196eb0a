"""The memories of experience in TensorFlow variables: the episode memory of the on-policy
algorithms and the replay memory of the off-policy ones, with their parts."""

from batchrl import _lazy

_EXPORTS = {
    "EpisodeMemory": "batchrl.memories.episode",
    "FrameStackStorage": "batchrl.memories.frame_storage",
    "NStepAccumulator": "batchrl.memories.n_step",
    "ObservationStorage": "batchrl.memories.observation_storage",
    "PrioritizedSampler": "batchrl.memories.samplers",
    "ReplayMemory": "batchrl.memories.replay",
    "SumTree": "batchrl.memories.sum_tree",
    "TransitionStorage": "batchrl.memories.storage",
    "UniformSampler": "batchrl.memories.samplers",
    "annealed_beta": "batchrl.memories.samplers",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

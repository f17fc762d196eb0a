"""batchrl: batched reinforcement learning in TensorFlow."""

__version__ = "0.1.0"

"""BatchPPO: PPO with an adaptive KL penalty and streaming normalization, in the graph."""

from batchrl.algorithms.ppo.algorithm import PPO

__all__ = ["PPO"]

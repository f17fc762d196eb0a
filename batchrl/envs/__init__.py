"""The short name of `batchrl.environments.native`, which configs use
(`env: batchrl.envs:Pendulum`): the in-graph environments."""

from batchrl.environments.native import CartPole, MinAtarBreakout, NativeBatchEnv, Pendulum

__all__ = ["CartPole", "MinAtarBreakout", "NativeBatchEnv", "Pendulum"]

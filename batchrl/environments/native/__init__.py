"""In-graph native environments: batches of classic-control tasks and MinAtar's Breakout
written in TensorFlow.

Their whole step is made of graph operations, so that a collection step can be compiled
with XLA (`tf.function(jit_compile=True)`); they duck-type `batchrl.tools.InGraphBatchEnv`
and work with `batchrl.drivers.simulate` and the training loop unchanged.
"""

from batchrl.environments.native.base import NativeBatchEnv
from batchrl.environments.native.breakout import MinAtarBreakout
from batchrl.environments.native.cartpole import CartPole
from batchrl.environments.native.pendulum import Pendulum

__all__ = ["CartPole", "MinAtarBreakout", "NativeBatchEnv", "Pendulum"]

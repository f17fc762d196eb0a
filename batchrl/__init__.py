"""batchrl: batched reinforcement learning in TensorFlow.

`batchrl.Agent` is imported on first access, so that environment worker processes, which
import this package, never import TensorFlow.
"""

__version__ = "0.1.0"
__all__ = ["Agent"]


def __getattr__(name):
    if name == "Agent":
        from batchrl.agent import Agent

        globals()["Agent"] = Agent
        return Agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""What runs agents and environments together: `simulate` (one batch step fused with the
algorithm in the graph), the training `Loop` around its compiled step function, and the
run's checkpoints and progress lines.

Names are imported lazily, so that importing this package imports no TensorFlow.
`drivers.simulate` is the function on every access; its module is
`sys.modules["batchrl.drivers.simulate"]`, and `from batchrl.drivers.simulate import ...`
reaches its other names (`act`, `observe`).
"""

from batchrl import _lazy

_EXPORTS = {
    "EnvironmentFailed": "batchrl.drivers.loop",
    "Interrupted": "batchrl.drivers.loop",
    "Loop": "batchrl.drivers.loop",
    "PhaseResult": "batchrl.drivers.progress",
    "episode_state": "batchrl.drivers.simulate",
    "simulate": "batchrl.drivers.simulate",
    "simulate_steps": "batchrl.drivers.simulate",
    "step_function": "batchrl.drivers.loop",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

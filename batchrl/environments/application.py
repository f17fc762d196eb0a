"""The in-graph batch of environments that an application steps itself."""

from batchrl.environments.in_graph import BatchVariables, BatchVariablesView


class ApplicationBatchEnv(BatchVariablesView):
    """What an algorithm sees of environments stepped by the application (`batchrl.Agent`).

    It holds the same variables as `InGraphBatchEnv` — `observ`, `action`, `reward`, `done`
    (starts all True) and `terminated`, each with a leading batch dimension `num_envs` — but
    nothing steps or resets environments: `batchrl.drivers.simulate.act` and `observe` assign
    the variables from what the application feeds in. `simulate` cannot drive it.

    Args:
      num_envs: int, the number of environments (the batch size).
      observation_space: `gymnasium.spaces.Box`, the space of one environment.
      action_space: `gymnasium.spaces.Box` or `Discrete`, the space of one environment.

    Raises:
      ValueError: for a `num_envs` below 1 or unsupported spaces.
    """

    in_graph = True  # Already in the graph: not to be wrapped in an `InGraphBatchEnv`.

    def __init__(self, num_envs, observation_space, action_space):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self._num_envs = int(num_envs)
        self.observation_space = observation_space
        self.action_space = action_space
        self._hold(BatchVariables(self._num_envs, observation_space, action_space))

    def __len__(self):
        return self._num_envs


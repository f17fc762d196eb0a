"""Fault injection (`python -m benchmarks.faults`): random faults in short training runs and
what they cost.

- `injection`: the command (trials, checks, the report);
- `envs`: environments that fail on purpose (`benchmarks.faults.envs:FaultyPendulum`);
- `actions`: the trainer whose batch environment is given bad actions once (`python -m
  benchmarks.faults.actions`);
- `train`: the trainer that stalls inside a checkpoint write (`python -m
  benchmarks.faults.train`).

Worker processes import `envs`: this package imports nothing itself.
"""

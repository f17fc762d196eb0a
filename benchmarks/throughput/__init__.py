"""The throughput suite, one program with parts (`python -m benchmarks.throughput`):

- `command`: the command (`run_benchmark`, `run_pairs`, `main`);
- `settings`: the measurement kinds, their `BASELINES`, the defaults, `PAIRS` and `GOALS`;
- `baselines`: the `Measurement` records, timing helpers and the measurements of raw
  stepping, without TensorFlow; the machine;
- `simulate`: `simulate` with `MockAlgorithm` and BatchPPO, the learning runs, the paired
  measurements;
- `report`: ratios, goals, JSON and Markdown (docs/performance.md and .json);
- `breakdown`: where the wall-clock time of a training run goes (`python -m
  benchmarks.throughput breakdown`), a section of docs/performance.md.

Worker processes import `baselines`: this package imports nothing itself.
"""

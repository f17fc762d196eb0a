"""Thin wrapper of `batchrl-benchmark` (batchrl/scripts/benchmark.py), kept for old commands."""
from batchrl.scripts.benchmark import main

if __name__ == "__main__":
    raise SystemExit(main())

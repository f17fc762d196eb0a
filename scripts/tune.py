"""Thin wrapper of `batchrl-tune` (batchrl/scripts/tune.py), kept for old commands."""
from batchrl.scripts.tune import main

if __name__ == "__main__":
    raise SystemExit(main())

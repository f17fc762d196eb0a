"""Thin wrapper of `batchrl-plot` (batchrl/scripts/plot.py), kept for old commands."""
from batchrl.scripts.plot import main

if __name__ == "__main__":
    raise SystemExit(main())

"""Learning algorithms that plug into `batchrl.tools.simulate`."""

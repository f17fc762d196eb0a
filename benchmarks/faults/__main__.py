"""`python -m benchmarks.faults [OPTIONS]`: the fault injection command (`injection`)."""

import sys

from benchmarks.faults.injection import main

if __name__ == "__main__":
    sys.exit(main())

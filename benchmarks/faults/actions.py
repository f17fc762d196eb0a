"""`python -m batchrl.scripts.train` whose batch environment is given bad actions once, for
`python -m benchmarks.faults` (run as `python -m benchmarks.faults.actions`).

With `BATCHRL_ACTION_FAULT=KIND` and `BATCHRL_ACTION_AFTER=N` set, the N-th call of the
batch environment's `step` (`BaseBatchEnv.step`, so any backend, EnvPool's included) gets,
in place of the policy's actions, the same actions but for environment 1's:

- `nan`: NaN (a `Box` action space);
- `bad`: one past the last action of a `Discrete` space (e.g. 2 for `Discrete(2)`).

The batch environment must refuse them with a ValueError naming environment 1, which the
trainer reports as `error: training failed ...` (exit code 1). Without these variables this
is the trainer unchanged; the batchrl package is not modified, `BaseBatchEnv.step` is
wrapped in this process only.
"""

import functools
import os
import sys

KINDS = ("nan", "bad")
KIND_VARIABLE = "BATCHRL_ACTION_FAULT"
AFTER_VARIABLE = "BATCHRL_ACTION_AFTER"


def spoil(actions, action_space, kind):
    """`actions` `[B, *action_shape]` with environment 1's action replaced (see above)."""
    import numpy as np

    if kind == "nan":
        actions = np.array(actions, np.float32)
        actions[1] = np.nan
    elif kind == "bad":
        actions = np.array(actions)
        actions[1] = action_space.start + action_space.n
    else:
        raise ValueError(f"unknown action fault {kind!r}; choices: {', '.join(KINDS)}")
    return actions


def install(kind, after):
    """Makes the `after`-th `BaseBatchEnv.step` of this process get `kind` actions."""
    if kind not in KINDS:
        raise ValueError(f"unknown action fault {kind!r}; choices: {', '.join(KINDS)}")
    from batchrl.environments.base import BaseBatchEnv

    step = BaseBatchEnv.step
    calls = [0]

    @functools.wraps(step)
    def faulty_step(self, actions):
        calls[0] += 1
        if calls[0] == after:
            actions = spoil(actions, self.action_space, kind)
        return step(self, actions)

    BaseBatchEnv.step = faulty_step


def main(argv=None):
    """The trainer with `argv`, the fault installed when the variables above are set;
    returns its exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # As the trainer does, before TF.
    kind = os.environ.get(KIND_VARIABLE)
    if kind:
        install(kind, int(os.environ[AFTER_VARIABLE]))
    from batchrl.scripts import train

    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""One learner process of `test_collective.py`: joins the two-learner cluster, builds the
test's IMPALA, learns from its share of the fragments with the gradients averaged over both
learners, and saves its trainable variables.

    python -m tests.distributed.collective_worker INDEX PORT0,PORT1 FRAGMENTS.npz OUT.npz
"""

import sys


def main(index, ports, fragments_path, out_path):
    from batchrl.distributed import collective

    all_reduce = collective.connect([f"localhost:{port}" for port in ports.split(",")], index,
                              timeout=60)
    import numpy as np

    from tests.distributed import test_collective

    fragments = test_collective.load(fragments_path)
    learner = test_collective.learner()
    learner.share_update(all_reduce)
    for fragment in fragments[index::2]:
        learner.learn(fragment)
    variables = (learner._joint_variables() + list(learner._observ_filter.variables)
                 + list(learner._reward_filter.variables))
    np.savez(out_path, *[variable.numpy() for variable in variables])


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:])

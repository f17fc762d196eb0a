"""REINFORCE written with build_algorithm, trained on CartPole by batchrl's `train`.

Usage: python examples/reinforce.py --logdir=RUN_DIR [train's other options, e.g. --set
seed=1]; the same as `PYTHONPATH=examples python -m batchrl.scripts.train
--config=examples/reinforce.yaml --logdir=RUN_DIR`.
"""
import pathlib
import sys

from batchrl.algorithms import build_algorithm
from batchrl.algorithms.advantage import discounted_cumsum, masked_mean, normalize
from batchrl.scripts import train


def postprocess(batch, *, discount):
    """Adds the return from each step on, G_t = sum_k discount^k r_{t+k}, and as the
    advantage G_t normalized over the batch (a constant baseline)."""
    returns = discounted_cumsum(batch["reward"], discount)
    return {**batch, "return": returns, "advantage": normalize(returns, batch["mask"])}


def loss(networks, distribution, batch):
    """-E[log pi(a_t|s_t) A_t]: its gradient is the policy gradient (Williams 1992)."""
    params, _ = networks.policy(batch["observ"], batch["initial_state"])
    log_prob = distribution(params).log_prob(batch["action"])
    return -masked_mean(log_prob * batch["advantage"], batch["mask"])


REINFORCE = build_algorithm("reinforce", loss, postprocess,
                            optimizer={"type": "adam", "learning_rate": 0.001})

if __name__ == "__main__":
    config = pathlib.Path(__file__).with_name("reinforce.yaml")  # CartPole, this algorithm.
    sys.exit(train.main([f"--config={config}", *sys.argv[1:]]))

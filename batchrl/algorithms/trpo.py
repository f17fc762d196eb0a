"""TRPO: trust region policy optimization, with GAE(lambda) advantages.

Schulman, Levine, Moritz, Jordan, Abbeel, "Trust Region Policy Optimization",
arXiv:1502.05477: maximize the surrogate L(theta) = E[pi_theta(a|s) / q(a|s) A(s, a)]
(eq. 14) subject to the mean KL(pi_old || pi_theta) <= delta (eq. 12), by a natural
gradient step of KL delta followed by a line search on L that also checks the constraint
(section 6, appendix C). The advantages are GAE(lambda) and the value function is fit to
the lambda-returns after the policy step (Schulman et al., "High-Dimensional Continuous
Control Using Generalized Advantage Estimation", arXiv:1506.02438, eq. 16 and section 5).
"""

from batchrl.algorithms import parts
from batchrl.algorithms.advantage import importance_ratio, masked, masked_mean
from batchrl.algorithms.builder import build_algorithm


def surrogate_loss(networks, distribution, batch):
    """-L(theta) (eq. 14): minus the mean over the valid steps of the advantage weighted by
    pi_theta(a_t|s_t) / q(a_t|s_t), q the policy that acted; float32 scalar, to be
    minimized. Padded steps add nothing, whatever they hold (`importance_ratio`, `masked`).
    """
    action, mask = batch["action"], batch["mask"]
    new = parts.current_policy(networks, distribution, batch).log_prob(action)
    old = parts.stored_policy(distribution, batch).log_prob(action)
    ratio = importance_ratio(new, old, mask)
    return -masked_mean(ratio * masked(batch["advantage"], mask), mask)


TRPO = build_algorithm(
    "trpo", surrogate_loss, parts.gae_postprocess, parts.value_loss,
    optimizer={"type": "natural_gradient", "max_kl": 0.01, "cg_iterations": 10,
               "damping": 0.1, "line_search": {"max_iterations": 10, "accept_ratio": 0.1}},
    value_optimizer={"type": "multi_step", "steps": 20, "optimizer": {"type": "adam"}})

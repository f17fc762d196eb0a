"""A2C: synchronous advantage actor-critic, with GAE(lambda) advantages and a value baseline.

Mnih et al., "Asynchronous Methods for Deep Reinforcement Learning", arXiv:1602.01783,
section 4 and algorithm S3: the policy gradient of log pi(a_t|s_t) A_t plus an entropy
bonus beta H(pi(s_t)), and the value function regressed on the returns. Here synchronous
(the episodes of all agents form one batch, one step per batch), with the advantages of
Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv:1506.02438, eq. 16, normalized over the batch.
"""

from batchrl.algorithms import parts
from batchrl.algorithms.advantage import masked, masked_mean
from batchrl.algorithms.builder import build_algorithm


def actor_loss(networks, distribution, batch, *, entropy_coef):
    """-E[log pi(a_t|s_t) A_t] - entropy_coef * E[H(pi(s_t))], the means over the valid
    steps (padded steps add nothing, whatever they hold: `masked`); float32 scalar, to be
    minimized: its gradient is minus the policy gradient with an entropy bonus."""
    policy, mask = parts.current_policy(networks, distribution, batch), batch["mask"]
    gradient_term = masked_mean(
        policy.log_prob(batch["action"]) * masked(batch["advantage"], mask), mask)
    return -gradient_term - entropy_coef * masked_mean(policy.entropy(), mask)


A2C = build_algorithm(
    "a2c", actor_loss, parts.gae_postprocess, parts.value_loss,
    optimizer={"type": "rmsprop", "rho": 0.99, "epsilon": 1e-5},
    value_optimizer={"type": "rmsprop", "rho": 0.99, "epsilon": 1e-5})

"""Functions of batches that algorithms made with `build_algorithm` share: the current and
the stored policies, the KL from the update's start, GAE(lambda) postprocessing and the
value regression loss. Each is a pure function of tensors (see `build_algorithm` for the
batch's keys)."""

import tensorflow as tf

from batchrl.algorithms.advantage import generalized_advantage, masked, masked_mean, normalize


def current_policy(networks, distribution, batch):
    """The distribution of the policy as its variables are now, on the batch's episodes
    (replayed from `batch["initial_state"]`); its parameters are `[episodes, time, ...]`."""
    params, _ = networks.policy(batch["observ"], batch["initial_state"])
    return distribution(params)


def stored_policy(distribution, batch, prefix="policy_"):
    """The distribution of the parameters stored in the batch under `prefix`: `policy_`,
    the policy that acted; `old_policy_`, the policy when the update began."""
    return distribution({key[len(prefix):]: value for key, value in batch.items()
                         if key.startswith(prefix)})


def kl_from_update_start(networks, distribution, batch):
    """The mean KL divergence KL(pi_old || pi) over the batch's valid steps, from the
    policy when the update began (pi_old, held fixed) to the current one, in nats: the
    constraint of TRPO (Schulman et al., arXiv:1502.05477, eq. 12). Float32 scalar."""
    old = stored_policy(distribution, batch, "old_policy_")
    new = current_policy(networks, distribution, batch)
    return masked_mean(old.kl(new), batch["mask"])


def gae_postprocess(batch, *, discount, gae_lambda):
    """Adds `advantage`, GAE(lambda) normalized to mean 0 and standard deviation 1 over the
    batch, and `return`, the lambda-returns A_t + V(s_t) as value targets (Schulman et
    al., arXiv:1506.02438, eq. 16); both float32 `[episodes, time]`."""
    advantage, returns = generalized_advantage(
        batch["reward"], batch["value"], batch["bootstrap"], batch["length"], discount,
        gae_lambda)
    return {**batch, "advantage": normalize(advantage, batch["mask"]), "return": returns}


def value_loss(networks, distribution, batch):
    """Half the mean squared error of V(s_t) against `batch["return"]` over the valid steps;
    float32 scalar. The returns are masked before the difference, so that a NaN or
    infinite return at a padded step adds nothing and passes no NaN gradient."""
    del distribution
    target = masked(batch["return"], batch["mask"])
    return 0.5 * masked_mean(tf.square(networks.value(batch["observ"]) - target),
                             batch["mask"])

"""Losses of PPO with an adaptive KL penalty and a KL cut-off penalty, or the clipped
surrogate.

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347, section 4
(adaptive KL penalty coefficient); Heess et al., "Emergence of Locomotion Behaviours in Rich
Environments", arXiv:1707.02286, algorithm 1 (squared hinge penalty on the KL above twice
its target).
"""

import tensorflow as tf

from batchrl.algorithms.advantage import importance_ratio, masked, masked_mean


def policy_loss(log_prob, old_log_prob, advantage, kl, mask, penalty, kl_target,
                kl_cutoff_factor, kl_cutoff_coef, entropy=None, entropy_coef=0.0,
                clip_ratio=None):
    """Penalized surrogate objective of PPO, to be minimized.

    `L = -E[r_t A_t] + beta * E[KL] + kl_cutoff_coef * E_rows[max(0, KL_e - c)^2]
    - entropy_coef * E[H]`, with the importance ratio `r_t = exp(log_prob - old_log_prob)`,
    the mean KL of each row `KL_e` (a row is an episode or a chunk of one),
    `c = kl_cutoff_factor * kl_target`, and the policy's entropy `H` (the bonus of
    arXiv:1707.06347, eq. 9). Masked-out steps count as 0 whatever they hold (NaN and
    infinities included) and pass no gradient (`batchrl.algorithms.advantage.masked`).

    Args:
      log_prob: float32 `[rows, time]`, log pi(a_t | s_t) under the current policy.
      old_log_prob: float32 `[rows, time]`, the same under the policy that acted.
      advantage: float32 `[rows, time]`, normalized advantages.
      kl: float32 `[rows, time]`, KL(reference policy || current policy) at each step
        (the reference: the policy that acted or the one before the update).
      mask: float32 `[rows, time]`, 1 for valid steps.
      penalty: float32 scalar, the KL penalty coefficient beta.
      kl_target, kl_cutoff_factor, kl_cutoff_coef: floats.
      entropy: optional float32 `[rows, time]`, the current policy's entropy in nats.
      entropy_coef: float >= 0, the weight of the entropy bonus (used with `entropy`).
      clip_ratio: None, or epsilon > 0 for the clipped surrogate instead (arXiv:1707.06347,
        eq. 7): `L = -E[min(r_t A_t, clip(r_t, 1 - epsilon, 1 + epsilon) A_t)]
        - entropy_coef * E[H]`, without the KL penalty and the cut-off (reported as 0).

    Returns:
      dict of float32 scalars: `loss` (the total), `surrogate`, `kl`, `kl_penalty`,
      `cutoff_penalty`, `cutoff_count` (rows whose KL exceeds the cut-off).
    """
    ratio = importance_ratio(log_prob, tf.stop_gradient(old_log_prob), mask)
    advantage = masked(tf.stop_gradient(advantage), mask)
    mean_kl = masked_mean(kl, mask)
    episode_kl = masked_mean(kl, mask, axis=1)
    cutoff = kl_cutoff_factor * kl_target
    over = tf.nn.relu(episode_kl - cutoff)
    valid_episodes = tf.cast(tf.reduce_sum(mask, 1) > 0, tf.float32)
    if clip_ratio is None:
        surrogate = -masked_mean(ratio * advantage, mask)
        cutoff_penalty = kl_cutoff_coef * masked_mean(tf.square(over), valid_episodes)
        kl_penalty = penalty * mean_kl
    else:
        clipped = tf.clip_by_value(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
        surrogate = -masked_mean(tf.minimum(ratio * advantage, clipped * advantage), mask)
        cutoff_penalty = kl_penalty = tf.constant(0.0)
        over = tf.zeros_like(over)
    loss = surrogate + kl_penalty + cutoff_penalty
    if entropy is not None and entropy_coef:
        loss -= entropy_coef * masked_mean(entropy, mask)
    return {
        "loss": loss,
        "surrogate": surrogate,
        "kl": mean_kl,
        "kl_penalty": kl_penalty,
        "cutoff_penalty": cutoff_penalty,
        "cutoff_count": tf.reduce_sum(tf.cast(over > 0, tf.float32) * valid_episodes),
    }


def value_loss(value, target, mask):
    """Half the mean squared error of the value predictions `value` (the value network's,
    finite) against `target` over the valid steps (`mask` 1); float32 scalar. The targets
    are masked before the difference, so that a NaN or infinite target at a masked-out
    step adds nothing and passes no NaN gradient."""
    target = masked(tf.stop_gradient(target), mask)
    return 0.5 * masked_mean(tf.square(value - target), mask)


def adapted_penalty(penalty, kl, kl_target, factor=1.5, high_ratio=1.3, low_ratio=0.7,
                    low=1e-6, high=1e6):
    """The KL penalty coefficient for the next update (arXiv:1707.06347, section 4).

    Multiplied by `factor` when `kl > high_ratio * kl_target`, divided by it when
    `kl < low_ratio * kl_target`, unchanged otherwise, and kept within `[low, high]` so
    that it can always recover.

    Args:
      penalty: float32 scalar, the current coefficient beta.
      kl: float32 scalar, the mean KL measured after the update.
      kl_target: the KL target.

    Returns:
      float32 scalar, the new coefficient.
    """
    penalty = tf.convert_to_tensor(penalty, tf.float32)
    penalty = tf.where(kl > high_ratio * kl_target, penalty * factor, penalty)
    penalty = tf.where(kl < low_ratio * kl_target, penalty / factor, penalty)
    return tf.clip_by_value(penalty, low, high)

"""Generalized advantage estimation over padded batches of episodes."""

import tensorflow as tf


def sequence_mask(length, max_length):
    """float32 `[episodes, max_length]`: 1 for the valid steps of each episode, else 0."""
    return tf.sequence_mask(length, max_length, dtype=tf.float32)


def masked_mean(values, mask, axis=None):
    """Mean of `values` over the entries where `mask` is 1 (0 when there are none)."""
    return tf.reduce_sum(values * mask, axis) / tf.maximum(tf.reduce_sum(mask, axis), 1.0)


def discounted_cumsum(values, factor):
    """`out[:, t] = sum_k factor^k * values[:, t + k]`, along axis 1 of `[episodes, time]`."""
    time_major = tf.transpose(values)
    summed = tf.scan(lambda following, current: current + factor * following, time_major,
                     initializer=tf.zeros_like(time_major[0]), reverse=True)
    return tf.transpose(summed)


def generalized_advantage(reward, value, bootstrap, length, discount, gae_lambda):
    """GAE(lambda) advantages and lambda-returns of a padded batch of episodes.

    Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438, eq. 16:
    `delta_t = r_t + discount * V(s_{t+1}) - V(s_t)`,
    `A_t = sum_k (discount * lambda)^k delta_{t+k}`, and the value targets are
    `A_t + V(s_t)`.

    The value after the last step of an episode is `bootstrap`: the value of the final
    observation for an episode cut by a time limit (truncated), and 0 for one that reached
    a terminal state (terminated).

    Args:
      reward: float32 `[episodes, time]`.
      value: float32 `[episodes, time]`, V(s_t).
      bootstrap: float32 `[episodes]`, the value of the state after the last step.
      length: int32 `[episodes]`, number of valid steps; later steps are ignored.
      discount: the discount factor gamma in [0, 1].
      gae_lambda: lambda in [0, 1].

    Returns:
      `(advantage, target)`, float32 `[episodes, time]`, zero beyond each episode's length.
    """
    max_length = tf.shape(reward)[1]
    mask = sequence_mask(length, max_length)
    is_last = tf.equal(tf.range(max_length)[None, :], length[:, None] - 1)
    following = tf.concat([value[:, 1:], tf.zeros_like(value[:, :1])], 1)
    next_value = tf.where(is_last, bootstrap[:, None], following)
    delta = (reward + discount * next_value - value) * mask
    advantage = discounted_cumsum(delta, discount * gae_lambda)
    return advantage, (advantage + value) * mask


def normalize(values, mask):
    """`values` shifted and scaled to mean 0 and standard deviation 1 over the valid steps
    (`mask` 1), and 0 elsewhere; both float32 `[episodes, time]`."""
    mean = masked_mean(values, mask)
    std = tf.sqrt(masked_mean(tf.square(values - mean), mask))
    return (values - mean) / (std + 1e-8) * mask

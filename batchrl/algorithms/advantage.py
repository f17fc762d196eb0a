"""Generalized advantage estimation over padded batches of episodes."""

import tensorflow as tf


def sequence_mask(length, max_length):
    """float32 `[episodes, max_length]`: 1 for the valid steps of each episode, else 0."""
    return tf.sequence_mask(length, max_length, dtype=tf.float32)


def masked(values, mask):
    """`values` where `mask` is positive and 0 elsewhere (same shape and dtype).

    A selection (`tf.where`), not a product: a NaN or an infinity at a masked-out entry
    (e.g. in the stale padding of an episode memory) becomes 0 instead of `inf * 0 = NaN`,
    and the entry passes a zero gradient back. Mask a term before it enters an operation
    whose gradient involves it (a product, a square, an exponential).
    """
    return tf.where(mask > 0, values, tf.zeros_like(values))


def masked_mean(values, mask, axis=None):
    """Mean of `values` over the entries where `mask` is 1 (0 when there are none); entries
    where `mask` is 0 count as 0 whatever they hold, NaN and infinities included (`masked`).
    """
    return tf.reduce_sum(masked(values, mask) * mask, axis) / tf.maximum(
        tf.reduce_sum(mask, axis), 1.0)


def importance_ratio(log_prob, old_log_prob, mask):
    """`exp(log_prob - old_log_prob)`, pi(a_t|s_t) / q(a_t|s_t), at the valid steps (`mask`
    1) and 1 elsewhere; float32 `[episodes, time]` (Schulman et al., arXiv:1502.05477, eq.
    14; arXiv:1707.06347, eq. 6). The difference is masked before the exponential, so that
    a padded step whose stored policy gives an infinite or NaN log-probability yields
    neither an infinite ratio nor a NaN gradient.
    """
    return tf.exp(masked(log_prob - old_log_prob, mask))


def discounted_cumsum(values, factor):
    """`out[:, t] = values[:, t] + factor[:, t] * out[:, t + 1]` (0 after the last step),
    along axis 1 of `[episodes, time]`: `sum_k factor^k * values[:, t + k]` for a scalar
    `factor`; a float32 `[episodes, time]` factor may vary by step (0 stops the sum)."""
    time_major = tf.transpose(values)
    if len(getattr(factor, "shape", ())) == 0:  # A Python number or a scalar tensor.
        summed = tf.scan(lambda following, current: current + factor * following, time_major,
                         initializer=tf.zeros_like(time_major[0]), reverse=True)
    else:
        summed = tf.scan(lambda following, current: current[0] + current[1] * following,
                         (time_major, tf.transpose(factor)),
                         initializer=tf.zeros_like(time_major[0]), reverse=True)
    return tf.transpose(summed)


def last_steps(length, max_length):
    """bool `[rows, max_length]`: True at each row's last valid step (`length - 1`)."""
    return tf.equal(tf.range(max_length)[None, :], length[:, None] - 1)


def value_after(value, ends, end_value):
    """The value after each step of rows of consecutive steps, float32 `[rows, time]`:
    `end_value` (broadcast to `[rows, time]`) where `ends` (bool `[rows, time]`) is True,
    elsewhere `value[:, t + 1]` (`value`: `[rows, time]`; 0 after the last column)."""
    following = tf.concat([value[:, 1:], tf.zeros_like(value[:, :1])], 1)
    return tf.where(ends, end_value, following)


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
      `(advantage, target)`, float32 `[episodes, time]`, zero beyond each episode's length
      (whatever `reward` and `value` hold there).
    """
    max_length = tf.shape(reward)[1]
    mask = sequence_mask(length, max_length)
    next_value = value_after(value, last_steps(length, max_length), bootstrap[:, None])
    delta = masked(reward + discount * next_value - value, mask)
    advantage = discounted_cumsum(delta, discount * gae_lambda)
    return advantage, masked(advantage + value, mask)


def normalize(values, mask):
    """`values` shifted and scaled to mean 0 and standard deviation 1 over the valid steps
    (`mask` 1), and 0 elsewhere; both float32 `[episodes, time]`."""
    mean = masked_mean(values, mask)
    std = tf.sqrt(masked_mean(tf.square(values - mean), mask))
    return masked((values - mean) / (std + 1e-8), mask)


def rollout_advantage(reward, value, next_value, terminated, done, length, discount,
                      gae_lambda):
    """GAE(lambda) advantages and lambda-returns of fixed-length rollouts, each row one
    agent's consecutive steps, across the ends of its episodes.

    Schulman et al., arXiv:1506.02438, eq. 16, with the sums stopped at episode ends:
    `delta_t = r_t + discount * (1 - terminated_t) * V(s'_t) - V(s_t)` and
    `A_t = delta_t + discount * lambda * (1 - done_t) * A_{t+1}`, where `V(s'_t)`, the value
    after step t, is `V(s_{t+1})` inside an episode and `next_value` (the value of the
    observation after the step) where an episode ends (its final observation: a truncated
    episode bootstraps from it, a terminated one does not) and at a row's last valid step;
    the value targets are `A_t + V(s_t)`. Each piece of a row between episode ends thus
    gets the advantages `generalized_advantage` gives it as an episode of its own.

    Args:
      reward, value, next_value: float32 `[rows, time]`: r_t, V(s_t) and the value of the
        observation after step t.
      terminated: bool `[rows, time]`, step t ended its episode in a terminal state.
      done: bool `[rows, time]`, step t ended its episode (terminated, truncated or cut
        short where the rollout begins new episodes).
      length: int32 `[rows]`, the valid steps of each row; later steps are ignored.

    Returns:
      `(advantage, target)`, float32 `[rows, time]`, zero beyond each row's length.
    """
    max_length = tf.shape(reward)[1]
    mask = sequence_mask(length, max_length)
    after = value_after(value, done | last_steps(length, max_length), next_value)
    not_terminated = 1.0 - tf.cast(terminated, tf.float32)
    delta = masked(reward + discount * not_terminated * after - value, mask)
    factor = discount * gae_lambda * (1.0 - tf.cast(done, tf.float32))
    advantage = discounted_cumsum(delta, factor)
    return advantage, masked(advantage + value, mask)

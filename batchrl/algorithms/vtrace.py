"""V-trace: off-policy value targets and policy-gradient advantages for fragments that an
older policy acted (the actors' policy lag of an actor-learner).

Espeholt et al., "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", arXiv:1802.01561, section 4.
"""

import tensorflow as tf

from batchrl.algorithms.advantage import (
    discounted_cumsum,
    last_steps,
    masked,
    sequence_mask,
    value_after,
)


def vtrace(log_ratio, reward, value, next_value, terminated, done, length, *, discount,
           gae_lambda=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0):
    """V-trace targets and policy-gradient advantages of fixed-length rollouts, each row
    one environment's consecutive steps, across the ends of its episodes.

    With the truncated importance weights `rho_t = min(rho_bar, pi(a_t|s_t) / mu(a_t|s_t))`
    and `c_t = gae_lambda * min(c_bar, pi / mu)` (mu: the behaviour policy that acted, pi:
    the learner's), Espeholt et al., arXiv:1802.01561, eq. 1 in its recursive form (section
    4.1, remark 1), with the sums stopped at episode ends:
    `delta_t = rho_t * (r_t + discount * (1 - terminated_t) * V(s'_t) - V(s_t))`,
    `v_t = V(s_t) + delta_t + discount * (1 - done_t) * c_t * (v_{t+1} - V(s_{t+1}))`;
    and the advantage of the policy gradient (section 4.2), with
    `rho'_t = min(pg_rho_bar, pi / mu)`:
    `A_t = rho'_t * (r_t + discount * (1 - terminated_t) * v'_t - V(s_t))` (`rho'_t` 1
    with `pg_rho_bar` None: for a loss that weighs with pi / mu itself, as APPO's), where
    `v'_t = v_{t+1}` inside an episode and `V(s'_t)` after its last step and after a row's
    last valid step. `V(s'_t)`, the value after step t, is `V(s_{t+1})` inside an episode
    and `next_value` (the value of the observation after the step: the final observation
    of a truncated episode bootstraps, a terminated one does not) where an episode ends and
    at a row's last valid step. The lambda of section 4.1 (remark 2) multiplies c only.

    On-policy (`log_ratio` 0) with `rho_bar`, `c_bar` >= 1, `v_t` is the lambda-return of
    `advantage.rollout_advantage` (GAE's target); with `gae_lambda` 1 it is the n-step
    return to the row's end, bootstrapped from its value.

    Args:
      log_ratio: float32 `[rows, time]`, `log pi(a_t|s_t) - log mu(a_t|s_t)`.
      reward, value, next_value: float32 `[rows, time]`: r_t, V(s_t) and the value of the
        observation after step t.
      terminated: bool `[rows, time]`, step t ended its episode in a terminal state.
      done: bool `[rows, time]`, step t ended its episode (terminated or truncated).
      length: int32 `[rows]`, the valid steps of each row; later steps are ignored.
      discount: gamma in [0, 1].
      gae_lambda: lambda in [0, 1], the trace's decay (1: the paper's V-trace).
      rho_bar, c_bar, pg_rho_bar: the truncation levels, > 0 (the paper: 1);
        `pg_rho_bar` None: the advantage is not weighted. The paper's analysis assumes
        `rho_bar >= c_bar` (section 4.1, below eq. 1): IMPALA and APPO refuse a config
        without it; this function computes the sums for any levels and does not check.

    Returns:
      `(target, advantage)`: float32 `[rows, time]`, `v_t` and `A_t`, zero beyond each
      row's length. Both are constants of the learner's loss (no gradient flows through
      them: the caller stops it, as the paper's loss treats v_s as a target).
    """
    max_length = tf.shape(reward)[1]
    mask = sequence_mask(length, max_length)
    ratio = tf.exp(masked(log_ratio, mask))
    rho = tf.minimum(rho_bar, ratio)
    trace = gae_lambda * tf.minimum(c_bar, ratio)
    ends = done | last_steps(length, max_length)
    after = value_after(value, ends, next_value)
    not_terminated = 1.0 - tf.cast(terminated, tf.float32)
    delta = masked(rho * (reward + discount * not_terminated * after - value), mask)
    factor = discount * (1.0 - tf.cast(ends, tf.float32)) * trace
    # `correction[t] = v_t - V(s_t) = delta_t + discount * c_t * correction[t + 1]` (0
    # across an episode's or the row's end).
    correction = discounted_cumsum(delta, factor)
    target = masked(correction + value, mask)
    target_after = value_after(target, ends, next_value)
    advantage = reward + discount * not_terminated * target_after - value
    if pg_rho_bar is not None:
        advantage *= tf.minimum(pg_rho_bar, ratio)
    advantage = masked(advantage, mask)
    return target, advantage

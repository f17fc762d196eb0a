"""APPO's update (`batchrl.algorithms.appo`) against NumPy: PPO's clipped surrogate, or the
KL-penalized one, with the ratio to the stored behaviour policy, on normalized V-trace
advantages without the weight rho' (with different levels rho_bar and c_bar where eq. 1
puts them), and the value regressed on V-trace's targets; the KL penalty measured from the
policy at the update's start and adapted as PPO adapts it; `update_epochs` optimizer steps;
and one step moving log-probabilities with the advantage."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms import APPO
from batchrl.algorithms.vtrace import vtrace
from tests.algorithms import gaussian_numpy
from tests.algorithms.gaussian_numpy import log_prob as _log_prob
from tests.algorithms.gaussian_numpy import params as _params
from tests.algorithms.test_impala import (
    DISCOUNT,
    LENGTH,
    MASK,
    _batch,
    _valid_mean,
    spread_batch,
)
from tests.algorithms.test_vtrace import _reference


def _algorithm(**overrides):
    return gaussian_numpy.algorithm_on_mocks(APPO, {
        "algorithm": "appo", "policy_layers": [16], "value_layers": [16],
        "rollout_length": 5, "discount": DISCOUNT, "gae_lambda": 1.0, "policy_lr": 0.01,
        "update_epochs": 1, "clip_ratio": 0.2, **overrides}, max_length=50)


def _tensors(batch):
    return {key: tf.constant(value) for key, value in batch.items()}


def _normalized(values):
    mean = _valid_mean(values)
    std = np.sqrt(_valid_mean((values - mean) ** 2))
    return (values - mean) / (std + 1e-8) * MASK


def _expected(algo, batch):
    """NumPy, on the networks before the update: the ratio pi / mu, the V-trace targets
    and unweighted advantages (V-trace's own, `pg_rho_bar` None, tested against the
    paper's sums by tests/algorithms/test_vtrace.py), the entropy and the value loss."""
    mean, logstd = _params(algo.networks, batch["observ"])
    old = _log_prob(batch["action"], batch["policy_mean"], batch["policy_logstd"])
    log_ratio = _log_prob(batch["action"], mean, logstd) - old
    target, advantage = vtrace(
        tf.constant(log_ratio, tf.float32), batch["reward"], batch["value"],
        batch["next_value"], batch["terminated"], batch["done"], LENGTH, discount=DISCOUNT,
        pg_rho_bar=None)
    value_now = algo.networks.value(batch["observ"]).numpy()
    return {
        "ratio": np.exp(log_ratio), "advantage": advantage.numpy() * MASK,
        "target": target.numpy(),
        "entropy": gaussian_numpy.entropy(logstd),
        "value_loss": 0.5 * _valid_mean((target.numpy() - value_now) ** 2)}


@pytest.mark.parametrize("clip_ratio", [0.2, 0.05])
def test_the_clipped_surrogate_weighs_normalized_vtrace_advantages_by_pi_over_mu(
        clip_ratio):
    """Acted by an older policy: the loss of the step is
    -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)) + value_coef * mean((v_s - V(s))^2) / 2
    - entropy_coef * mean(H), with r = pi / mu and A the normalized unweighted V-trace
    advantage; the update returns A before the normalization."""
    algo = _algorithm(clip_ratio=clip_ratio, value_coef=0.3, entropy_coef=0.1)
    batch = _batch(algo, seed=1, stale=0.5)
    want = _expected(algo, batch)
    advantage = _normalized(want["advantage"])
    ratio = want["ratio"]
    clipped = np.clip(ratio, 1 - clip_ratio, 1 + clip_ratio)
    surrogate = -_valid_mean(np.minimum(ratio * advantage, clipped * advantage))
    assert np.any((ratio > 1 + clip_ratio) | (ratio < 1 - clip_ratio)), "the clip is reached"

    got = algo.update(_tensors(batch))

    np.testing.assert_allclose(got["advantage"].numpy() * MASK, want["advantage"],
                               rtol=1e-5, atol=1e-5)
    assert float(got["surrogate"]) == pytest.approx(surrogate, rel=1e-4, abs=1e-6)
    assert float(got["value_loss"]) == pytest.approx(want["value_loss"], rel=1e-5)
    assert float(got["loss"]) == pytest.approx(
        surrogate + 0.3 * want["value_loss"] - 0.1 * _valid_mean(want["entropy"]),
        rel=1e-4, abs=1e-6)
    assert float(got["mean_return"]) == pytest.approx(_valid_mean(want["target"]), rel=1e-5)
    assert float(got["mean_rho"]) == pytest.approx(_valid_mean(ratio), rel=1e-5)
    assert "kl_penalty" not in got


def _kl_algorithm(**overrides):
    return _algorithm(clip_ratio=None, kl_init_penalty=2.0, kl_target=0.01, **overrides)


def _penalized_loss(batch, reference, params, value, target, advantage):
    """The loss of a step of `clip_ratio` null on the policy `params` (mean, logstd) and
    value estimates `value`: -mean(r A) + beta * mean(KL(reference || pi)) + the cut-off
    penalty (1000 * mean over rows of max(0, KL_row - 2 kl_target)^2) + value_coef *
    mean((v_s - V(s))^2) / 2, with r = pi / mu, beta 2, kl_target 0.01, value_coef 0.5."""
    ratio = np.exp(_log_prob(batch["action"], *params)
                   - _log_prob(batch["action"], batch["policy_mean"], batch["policy_logstd"]))
    kl = gaussian_numpy.kl(*reference, *params)
    row_kl = np.sum(kl * MASK, 1) / np.sum(MASK, 1)
    cutoff = 1000.0 * np.mean(np.maximum(0.0, row_kl - 0.02) ** 2)
    return (-_valid_mean(ratio * _normalized(advantage)) + 2.0 * _valid_mean(kl) + cutoff
            + 0.5 * 0.5 * _valid_mean((target - value) ** 2))


def test_without_clip_ratio_the_penalty_is_on_the_kl_from_the_policy_at_the_updates_start():
    """`clip_ratio` null, a batch whose mu is far from the learner's policy (KL(mu || pi)
    about 1.4 nats, 140 kl_target): the KL penalty and the cut-off are on KL(pi_old || pi)
    from the policy at the update's start pi_old, not from mu: 0 at the first step (its
    loss is the surrogate's and the value's alone), at the second step that of the policy
    after the first (NumPy, the first step's policy and value read from an update of one
    epoch from the same start)."""
    one = _kl_algorithm(update_epochs=1)
    batch = _batch(one, seed=2, stale=0.5)
    want = _expected(one, batch)
    start = _params(one.networks, batch["observ"])
    behaviour = (batch["policy_mean"], batch["policy_logstd"])
    assert _valid_mean(gaussian_numpy.kl(*behaviour, *start)) > 100 * 0.01

    first = one.update(_tensors(batch))
    assert float(first["loss"]) == pytest.approx(
        -_valid_mean(want["ratio"] * _normalized(want["advantage"]))
        + 0.5 * want["value_loss"], rel=1e-4, abs=1e-6)
    after_first = _params(one.networks, batch["observ"])
    value_after_first = one.networks.value(batch["observ"]).numpy()
    second = _kl_algorithm(update_epochs=2).update(_tensors(batch))

    assert float(second["loss"]) == pytest.approx(_penalized_loss(
        batch, start, after_first, value_after_first, want["target"], want["advantage"]),
        rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("policy_lr, epochs, factor", [
    (1e-4, 1, 1 / 1.5), (0.01, 1, 1.5), (0.01, 4, 1.0)],
    ids=["small-step", "large-step", "four-steps-back-near-the-target"])
def test_the_penalty_adapts_on_the_kl_from_the_policy_at_the_updates_start(
        policy_lr, epochs, factor):
    """After the update, the reported `kl` is KL(pi_old || pi_new) from the policy at the
    update's start to the updated one (NumPy), `behaviour_kl` KL(mu || pi_new), and beta
    (2) is adapted on `kl` by PPO's rule (`losses.adapted_penalty`, arXiv:1707.06347,
    section 4): times 1.5 above 1.3 kl_target, divided by 1.5 below 0.7 kl_target. mu is
    far behind (KL(mu || pi_new) above 1 nat): on KL from mu, every case would be x1.5."""
    algo = _kl_algorithm(policy_lr=policy_lr, update_epochs=epochs)
    batch = _batch(algo, seed=2, stale=0.5)
    start = _params(algo.networks, batch["observ"])

    got = algo.update(_tensors(batch))

    new = _params(algo.networks, batch["observ"])
    kl = _valid_mean(gaussian_numpy.kl(*start, *new))
    behaviour_kl = _valid_mean(gaussian_numpy.kl(
        batch["policy_mean"], batch["policy_logstd"], *new))
    assert float(got["kl"]) == pytest.approx(kl, rel=1e-4, abs=1e-6)  # float32
    assert float(got["behaviour_kl"]) == pytest.approx(behaviour_kl, rel=1e-4)
    assert behaviour_kl > 1.0
    rule = 1.5 if kl > 1.3 * 0.01 else 1 / 1.5 if kl < 0.7 * 0.01 else 1.0
    assert rule == factor, f"KL {kl} is not in the case's range"
    assert float(got["kl_penalty"]) == pytest.approx(2.0 * factor, rel=1e-6)
    assert float(algo.checkpoint_state["kl_penalty"]) == pytest.approx(2.0 * factor)


def test_update_epochs_steps_on_the_same_batch():
    """`update_epochs` steps of the optimizer per update; more steps move the policy further
    from mu on the same batch (the same start, the same targets)."""
    kls = []
    for epochs in (1, 4):
        algo = _algorithm(update_epochs=epochs, clip_ratio=10.0)
        batch = _batch(algo, seed=3)
        got = algo.update(_tensors(batch))
        assert int(algo._policy_optimizer.optimizer.iterations) == epochs
        kls.append(float(got["kl"]))
    assert kls[1] > 2 * kls[0] > 0


def test_minibatches_of_batch_size_rows_share_each_epoch():
    """`batch_size` rows per step: each epoch takes one step per minibatch (2 rows, 1 per
    minibatch: 2 steps an epoch); a batch_size above the rows is an error naming it."""
    algo = _algorithm(update_epochs=3, batch_size=1)
    algo.update(_tensors(_batch(algo, seed=3)))
    assert int(algo._policy_optimizer.optimizer.iterations) == 3 * 2
    algo = _algorithm(batch_size=3)
    with pytest.raises(ValueError, match="batch_size 3 is more than the 2 rows"):
        algo.update(_tensors(_batch(algo, seed=3)))


def test_one_step_raises_the_log_probability_of_actions_with_a_higher_advantage():
    """Acted by the policy itself (r = 1) and no value loss: the step follows
    mean(A_normalized * grad log pi), so that the change of log pi(a|s) correlates with the
    normalized advantage."""
    algo = _algorithm(value_coef=0.0)
    batch = _batch(algo, seed=4)
    before = _params(algo.networks, batch["observ"])
    got = algo.update(_tensors(batch))
    after = _params(algo.networks, batch["observ"])
    change = _log_prob(batch["action"], *after) - _log_prob(batch["action"], *before)
    advantage = _normalized(got["advantage"].numpy())
    assert _valid_mean(change * advantage) > 1e-4
    assert float(got["mean_rho"]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("actors, key", [(1, "envs_per_actor"), (0, "num_agents")])
def test_a_batch_size_above_the_rows_of_a_batch_is_a_config_error(actors, key):
    from batchrl import build, configs

    settings = {"actors": actors, "envs_per_actor": 6, "num_agents": 6}
    build.check(configs.load("pendulum_appo", {**settings, "batch_size": 6}))
    with pytest.raises(configs.ConfigError, match=f"a batch has {key} = 6 rows"):
        build.check(configs.load("pendulum_appo", {**settings, "batch_size": 7}))


def test_rho_bar_and_c_bar_truncate_where_eq_1_puts_them():
    """rho_bar 1.0 and c_bar 0.5 with ratios spread around 1: the targets are eq. 1's with
    rho_s = min(1.0, pi / mu) and c_s = min(0.5, pi / mu), the advantages section 4.2's
    without the weight rho' (NumPy sums, `test_vtrace._reference`); the two levels swapped
    give other values."""
    algo = _algorithm(rho_bar=1.0, c_bar=0.5)
    batch, sums = spread_batch(algo)
    target, advantage = _reference(sums, DISCOUNT, 1.0, 1.0, 0.5, None)
    swapped, _ = _reference(sums, DISCOUNT, 1.0, 0.5, 1.0, None)
    assert np.abs(swapped - target).max() > 0.05, "the swap changes the targets"

    got = algo.update(_tensors(batch))

    np.testing.assert_allclose(got["advantage"].numpy() * MASK, advantage,
                               rtol=1e-5, atol=1e-5)
    assert float(got["mean_return"]) == pytest.approx(_valid_mean(target), rel=1e-5)

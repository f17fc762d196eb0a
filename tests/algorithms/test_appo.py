"""APPO's update (`batchrl.algorithms.appo`) against NumPy: PPO's clipped surrogate, or the
KL-penalized one, with the ratio to the stored behaviour policy, on normalized V-trace
advantages without the weight rho', and the value regressed on V-trace's targets; the
penalty adapted as PPO adapts it; `update_epochs` optimizer steps; and one step moving
log-probabilities with the advantage."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms import APPO
from batchrl.algorithms.vtrace import vtrace
from tests.algorithms import gaussian_numpy
from tests.algorithms.gaussian_numpy import log_prob as _log_prob
from tests.algorithms.gaussian_numpy import params as _params
from tests.algorithms.test_impala import DISCOUNT, LENGTH, MASK, _batch, _valid_mean


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
    paper's sums by tests/algorithms/test_vtrace.py), the KL(mu || pi), the entropy and
    the value loss."""
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
        "kl": gaussian_numpy.kl(batch["policy_mean"], batch["policy_logstd"], mean, logstd),
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


@pytest.mark.parametrize("stale, policy_lr, factor", [(0.5, 0.01, 1.5), (0.0, 1e-4, 1 / 1.5)],
                         ids=["far-behind", "on-policy-small-step"])
def test_without_clip_ratio_the_kl_from_mu_is_penalized_and_the_penalty_adapted(
        stale, policy_lr, factor):
    """`clip_ratio` null: the loss is -mean(r A) + beta * mean(KL(mu || pi)) + the cut-off
    penalty (1000 * mean over rows of max(0, KL_row - 2 kl_target)^2); after the update,
    beta is multiplied by 1.5 when the KL from mu exceeds 1.3 kl_target, divided by it
    below 0.7 kl_target (arXiv:1707.06347, section 4)."""
    algo = _algorithm(clip_ratio=None, kl_init_penalty=2.0, kl_target=0.01,
                      policy_lr=policy_lr)
    batch = _batch(algo, seed=2, stale=stale)
    want = _expected(algo, batch)
    advantage = _normalized(want["advantage"])
    row_kl = np.sum(want["kl"] * MASK, 1) / np.sum(MASK, 1)
    cutoff = 1000.0 * np.mean(np.maximum(0.0, row_kl - 0.02) ** 2)
    loss = (-_valid_mean(want["ratio"] * advantage) + 2.0 * _valid_mean(want["kl"])
            + cutoff + 0.5 * want["value_loss"])

    got = algo.update(_tensors(batch))

    assert float(got["loss"]) == pytest.approx(loss, rel=1e-4, abs=1e-6)
    measured = float(got["kl"])  # From mu to the updated policy.
    assert (measured > 0.013) == (factor > 1) and (measured < 0.007) == (factor < 1)
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

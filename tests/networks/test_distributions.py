"""The distributions of nested action spaces against NumPy: Bernoulli, MultiCategorical and
their Composite with a Gaussian."""

import functools

import numpy as np
import tensorflow as tf

from batchrl.networks.distributions import (
    Bernoulli,
    Categorical,
    Composite,
    DiagonalGaussian,
    MultiCategorical,
)


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def test_bernoulli_against_numpy():
    rng = np.random.default_rng(0)
    logits, other_logits = rng.normal(size=(2, 5, 3)).astype(np.float32) * 2
    action = rng.integers(0, 2, size=(5, 3)).astype(np.float32)
    p, q = Bernoulli({"logits": logits}), Bernoulli({"logits": other_logits})
    log_p1, log_p0 = _log_sigmoid(logits), _log_sigmoid(-logits)
    log_q1, log_q0 = _log_sigmoid(other_logits), _log_sigmoid(-other_logits)
    np.testing.assert_allclose(p.log_prob(action).numpy(),
                               np.sum(action * log_p1 + (1 - action) * log_p0, -1), rtol=1e-5)
    entropy = -np.sum(np.exp(log_p1) * log_p1 + np.exp(log_p0) * log_p0, -1)
    np.testing.assert_allclose(p.entropy().numpy(), entropy, rtol=1e-5)
    kl = np.sum(np.exp(log_p1) * (log_p1 - log_q1) + np.exp(log_p0) * (log_p0 - log_q0), -1)
    np.testing.assert_allclose(p.kl(q).numpy(), kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(p.kl(p).numpy(), 0.0, atol=1e-6)
    np.testing.assert_array_equal(p.mode().numpy(), logits > 0)
    probability = np.array([0.1, 0.5, 0.9], np.float32)
    many = Bernoulli({"logits": np.tile(np.log(probability / (1 - probability)), (30000, 1))})
    drawn = many.sample(tf.random.Generator.from_seed(0)).numpy()
    assert set(np.unique(drawn)) == {0.0, 1.0}
    np.testing.assert_allclose(drawn.mean(0), probability, atol=0.01)


def test_multi_categorical_sums_over_choices_and_never_draws_missing_actions():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 2, 3)).astype(np.float32)
    logits[:, 0, 2] = -1e9  # The first choice has two actions, the second three.
    other = rng.normal(size=(4, 2, 3)).astype(np.float32)
    other[:, 0, 2] = -1e9
    p, q = MultiCategorical({"logits": logits}), MultiCategorical({"logits": other})
    first, second = (Categorical({"logits": logits[:, i, :2 + i]}) for i in range(2))
    first_q, second_q = (Categorical({"logits": other[:, i, :2 + i]}) for i in range(2))
    action = np.stack([rng.integers(0, 2, 4), rng.integers(0, 3, 4)], 1).astype(np.int32)
    np.testing.assert_allclose(
        p.log_prob(action).numpy(),
        first.log_prob(action[:, 0]).numpy() + second.log_prob(action[:, 1]).numpy(), rtol=1e-5)
    np.testing.assert_allclose(p.entropy().numpy(),
                               first.entropy().numpy() + second.entropy().numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        p.kl(q).numpy(), first.kl(first_q).numpy() + second.kl(second_q).numpy(),
        rtol=1e-4, atol=1e-6)
    assert np.isfinite(p.entropy().numpy()).all() and np.isfinite(p.kl(q).numpy()).all()
    many = MultiCategorical({"logits": np.zeros((20000, 2, 3), np.float32)
                             + np.array([[0, 0, -1e9], [0, 0, 0]], np.float32)})
    drawn = many.sample(tf.random.Generator.from_seed(2)).numpy()
    assert drawn.shape == (20000, 2) and drawn[:, 0].max() == 1
    np.testing.assert_allclose(np.bincount(drawn[:, 1]) / 20000, [1 / 3] * 3, atol=0.015)


def _composite(seed):
    rng = np.random.default_rng(seed)
    params = {"leaf0_mean": rng.normal(size=(6, 2)), "leaf0_logstd": rng.normal(size=(6, 2)),
              "leaf1_logits": rng.normal(size=(6, 1, 3)), "leaf2_logits": rng.normal(size=(6, 2))}
    params = {key: value.astype(np.float32) for key, value in params.items()}
    components = [("leaf0", DiagonalGaussian, 2), ("leaf1", MultiCategorical, 1),
                  ("leaf2", Bernoulli, 2)]
    parts = [DiagonalGaussian({"mean": params["leaf0_mean"],
                               "logstd": params["leaf0_logstd"]}),
             MultiCategorical({"logits": params["leaf1_logits"]}),
             Bernoulli({"logits": params["leaf2_logits"]})]
    return functools.partial(Composite, components=components)(params), parts


def test_composite_adds_up_its_components():
    (p, p_parts), (q, q_parts) = _composite(0), _composite(1)
    action = p.sample(tf.random.Generator.from_seed(0)).numpy()
    assert action.shape == (6, 5) and action.dtype == np.float32
    assert set(action[:, 2]) <= {0.0, 1.0, 2.0} and set(action[:, 3:].ravel()) <= {0.0, 1.0}
    pieces = [action[:, :2], action[:, 2:3].astype(np.int32), action[:, 3:]]
    np.testing.assert_allclose(
        p.log_prob(action).numpy(),
        sum(part.log_prob(piece).numpy() for part, piece in zip(p_parts, pieces, strict=True)),
        rtol=1e-5)
    np.testing.assert_allclose(p.entropy().numpy(),
                               sum(part.entropy().numpy() for part in p_parts), rtol=1e-5)
    np.testing.assert_allclose(
        p.kl(q).numpy(),
        sum(a.kl(b).numpy() for a, b in zip(p_parts, q_parts, strict=True)), rtol=1e-4)
    np.testing.assert_allclose(p.kl(p).numpy(), 0.0, atol=1e-5)
    mode = p.mode().numpy()
    np.testing.assert_array_equal(mode[:, :2], p_parts[0].mode().numpy())
    np.testing.assert_array_equal(mode[:, 2], p_parts[1].mode().numpy()[:, 0])
    np.testing.assert_array_equal(mode[:, 3:], p_parts[2].mode().numpy())

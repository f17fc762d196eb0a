"""The functions TRPO and A2C are made of (`trpo.surrogate_loss`, `a2c.actor_loss`,
`parts.gae_postprocess`, `parts.value_loss`) against NumPy, and the direction of one update
of each: the log-probability of actions with a positive advantage rises (TRPO within its KL
bound), that of actions with a negative one falls."""


import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms import A2C, TRPO, a2c, parts, trpo
from tests.algorithms import gaussian_numpy
from tests.algorithms.gaussian_numpy import kl as _kl
from tests.algorithms.gaussian_numpy import log_prob as _log_prob
from tests.algorithms.gaussian_numpy import params as _params

LENGTH = np.array([5, 3], np.int32)  # Two episodes padded to 5 steps.
MASK = (np.arange(5)[None] < LENGTH[:, None]).astype(np.float32)


def _algorithm(algorithm, **overrides):
    return gaussian_numpy.algorithm_on_mocks(
        algorithm, {"policy_layers": [16], "value_layers": [16], "update_every": 2,
                    **overrides}, max_length=5)


def _valid_mean(values):
    return np.sum(values * MASK) / np.sum(MASK)


def _batch(algo, seed=0, stale=0.0):
    """A batch of two episodes (5 and 3 valid steps) of random normalized observations,
    actions 0.8 standard deviations from the policy's mean, advantages and returns; the
    stored policy (`policy_`) is the current one with its mean moved by `stale`."""
    rng = np.random.default_rng(seed)
    observ = rng.normal(size=(2, 5, 3)).astype(np.float32)
    mean, logstd = _params(algo.networks, observ)
    sign = rng.choice([-1.0, 1.0], size=mean.shape)
    action = (mean + 0.8 * sign * np.exp(logstd)).astype(np.float32)
    stored_mean = mean + stale * rng.normal(size=mean.shape)
    return {
        "observ": observ, "action": action, "mask": MASK, "length": LENGTH,
        "initial_state": np.zeros((2, 0), np.float32),
        "advantage": (rng.normal(size=(2, 5)) * MASK).astype(np.float32),
        "return": (rng.normal(size=(2, 5)) * MASK).astype(np.float32),
        "policy_mean": stored_mean.astype(np.float32), "policy_logstd": logstd,
        "old_policy_mean": mean, "old_policy_logstd": logstd}


def test_trpo_surrogate_loss_against_numpy():
    """-L(theta) = -mean over the valid steps of pi_theta(a|s) / q(a|s) * A (eq. 14)."""
    algo = _algorithm(TRPO)
    batch = _batch(algo, stale=0.3)
    mean, logstd = _params(algo.networks, batch["observ"])
    ratio = np.exp(_log_prob(batch["action"], mean, logstd)
                   - _log_prob(batch["action"], batch["policy_mean"], logstd))
    want = -_valid_mean(ratio * batch["advantage"])
    got = float(trpo.surrogate_loss(algo.networks, algo.networks.distribution, batch))
    assert got == pytest.approx(want, rel=1e-5)
    assert abs(_valid_mean(ratio) - 1.0) > 0.05, "the stored policy is not the current one"


def test_a2c_actor_loss_against_numpy():
    """-mean(log pi(a|s) A) - entropy_coef * mean(H), over the valid steps."""
    algo = _algorithm(A2C)
    batch = _batch(algo)
    mean, logstd = _params(algo.networks, batch["observ"])
    log_prob = _log_prob(batch["action"], mean, logstd)
    entropy = gaussian_numpy.entropy(logstd)
    for coef in (0.0, 0.3):
        want = -_valid_mean(log_prob * batch["advantage"]) - coef * _valid_mean(entropy)
        got = float(a2c.actor_loss(algo.networks, algo.networks.distribution, batch,
                                   entropy_coef=coef))
        assert got == pytest.approx(want, rel=1e-5), coef


def _numpy_gae(reward, value, bootstrap, discount, lam):
    """GAE(lambda) of one episode (arXiv:1506.02438, eq. 16), NumPy."""
    advantage, running = np.zeros_like(reward), 0.0
    for t in reversed(range(len(reward))):
        following = bootstrap if t == len(reward) - 1 else value[t + 1]
        running = reward[t] + discount * following - value[t] + discount * lam * running
        advantage[t] = running
    return advantage


def test_gae_postprocess_against_numpy():
    """`advantage`: GAE(lambda) standardized over the valid steps of the batch; `return`:
    the lambda-returns A_t + V(s_t); both 0 at padded steps (which hold garbage here)."""
    rng = np.random.default_rng(3)
    reward = rng.normal(size=(2, 5)).astype(np.float32)
    value = rng.normal(size=(2, 5)).astype(np.float32)
    bootstrap = np.array([1.5, 0.0], np.float32)
    batch = {"reward": np.where(MASK > 0, reward, 7.0), "value": np.where(MASK > 0, value, -3.0),
             "bootstrap": bootstrap, "length": LENGTH, "mask": MASK, "kept": np.ones(2)}
    got = parts.gae_postprocess(batch, discount=0.9, gae_lambda=0.8)
    advantages = [_numpy_gae(reward[e, :n], value[e, :n], bootstrap[e], 0.9, 0.8)
                  for e, n in enumerate(LENGTH)]
    valid = np.concatenate(advantages)
    for e, n in enumerate(LENGTH):
        np.testing.assert_allclose(got["advantage"].numpy()[e, :n],
                                   (advantages[e] - valid.mean()) / (valid.std() + 1e-8),
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["return"].numpy()[e, :n], advantages[e] + value[e, :n],
                                   rtol=1e-5, atol=1e-6)
    assert not got["advantage"].numpy()[MASK == 0].any()
    assert not got["return"].numpy()[MASK == 0].any()
    np.testing.assert_array_equal(got["kept"], batch["kept"])


def test_value_loss_against_numpy():
    """Half the mean squared error of V(s) against the returns, over the valid steps."""
    algo = _algorithm(TRPO)
    batch = _batch(algo)
    value = algo.networks.value(batch["observ"]).numpy()
    want = 0.5 * _valid_mean((value - batch["return"]) ** 2)
    got = float(parts.value_loss(algo.networks, algo.networks.distribution, batch))
    assert got == pytest.approx(want, rel=1e-5)


def _loss_and_gradients(function, network, algo, batch):
    variables = network.trainable_variables
    with tf.GradientTape() as tape:
        loss = function(algo.networks, algo.networks.distribution, batch)
    gradients = tape.gradient(loss, variables)
    return float(loss), [gradient.numpy() for gradient in gradients]


@pytest.mark.parametrize("poison", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["surrogate", "actor", "value"])
def test_losses_ignore_non_finite_values_at_padded_steps(name, poison):
    """Stale padding (here NaN or infinite advantages, returns and stored policy
    parameters beyond each episode's length) changes neither the loss nor its gradients."""
    function = {"surrogate": trpo.surrogate_loss, "value": parts.value_loss,
                "actor": lambda *args: a2c.actor_loss(*args, entropy_coef=0.1)}[name]
    algo = _algorithm(TRPO)
    network = algo.networks.value if name == "value" else algo.networks.policy
    clean = _batch(algo, stale=0.3)
    poisoned = dict(clean)
    for key in ("advantage", "return", "policy_mean", "policy_logstd"):
        mask = MASK if clean[key].ndim == 2 else MASK[..., None]
        poisoned[key] = np.where(mask > 0, clean[key], poison).astype(np.float32)
    want, want_gradients = _loss_and_gradients(function, network, algo, clean)
    got, gradients = _loss_and_gradients(function, network, algo, poisoned)
    assert got == pytest.approx(want, rel=1e-6)
    for gradient, want_gradient in zip(gradients, want_gradients, strict=True):
        assert np.isfinite(gradient).all()
        np.testing.assert_allclose(gradient, want_gradient, rtol=1e-5, atol=1e-7)


def _one_policy_update(algo, batch):
    """The policy optimizer's step on the algorithm's loss, as its update takes it."""
    batch = {key: tf.constant(value) for key, value in batch.items()}
    networks, distribution = algo.networks, algo.networks.distribution
    algo._policy_optimizer.minimize(
        lambda: algo._functions["loss_fn"](networks, distribution, batch),
        networks.policy.trainable_variables,
        lambda: parts.kl_from_update_start(networks, distribution, batch))


@pytest.mark.parametrize("algorithm", [TRPO, A2C], ids=["trpo", "a2c"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_one_update_moves_log_probabilities_with_the_advantage(algorithm, sign):
    """All valid steps with advantage `sign`: one policy update raises (positive) or lowers
    (negative) the log-probability of the actions taken, on average over the steps; TRPO's
    step keeps the mean KL from the policy before it within `max_kl`."""
    algo = _algorithm(algorithm)
    batch = _batch(algo, seed=4)
    batch["advantage"] = sign * MASK
    before = _params(algo.networks, batch["observ"])
    _one_policy_update(algo, batch)
    after = _params(algo.networks, batch["observ"])
    change = (_log_prob(batch["action"], *after) - _log_prob(batch["action"], *before))
    assert sign * _valid_mean(change) > 1e-4
    kl = _valid_mean(_kl(*before, *after))
    assert kl > 0
    if algorithm is TRPO:
        max_kl = algo._config.get("optimizer") or TRPO.default_optimizer
        assert kl <= max_kl["max_kl"] * 1.001
        assert kl > 0.1 * max_kl["max_kl"], "a step of about the bound, not a tiny one"

"""IMPALA's update (`batchrl.algorithms.impala`) against NumPy: acted by the policy it
updates, its targets are the n-step returns and its loss that of Espeholt et al.,
arXiv:1802.01561, section 4.2; acted by another policy, its importance weights are pi / mu
of the stored behaviour policy; one update raises the log-probability of actions with a
positive advantage and lowers that of actions with a negative one."""


import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.algorithms import IMPALA
from batchrl.algorithms.vtrace import vtrace
from tests.algorithms import gaussian_numpy
from tests.algorithms.gaussian_numpy import log_prob as _log_prob
from tests.algorithms.gaussian_numpy import params as _params
from tests.algorithms.test_vtrace import _reference

LENGTH = np.array([5, 3], np.int32)  # Two rollouts, the second cut short after 3 steps.
MASK = (np.arange(5)[None] < LENGTH[:, None]).astype(np.float32)
DISCOUNT = 0.9


def _algorithm(**overrides):
    return gaussian_numpy.algorithm_on_mocks(IMPALA, {
        "algorithm": "impala", "policy_layers": [16], "value_layers": [16],
        "rollout_length": 5, "discount": DISCOUNT, "gae_lambda": 1.0, "policy_lr": 0.01,
        **overrides}, max_length=50)


def _valid_mean(values):
    return np.sum(values * MASK) / np.sum(MASK)


def _batch(algo, seed=0, stale=0.0):
    """Two rollouts of random normalized observations, rewards and values, with an episode
    that terminates (row 0, step 1) and one truncated (row 1, step 1); actions 0.8 standard
    deviations from the policy's mean; the behaviour policy (`policy_`) is the current one
    with its mean moved by `stale`. Padded steps hold garbage."""
    rng = np.random.default_rng(seed)
    observ = rng.normal(size=(2, 5, 3)).astype(np.float32)
    mean, logstd = _params(algo.networks, observ)
    sign = rng.choice([-1.0, 1.0], size=mean.shape)
    terminated = np.zeros((2, 5), bool)
    terminated[0, 1] = True
    done = terminated.copy()
    done[1, 1] = True
    return {
        "observ": observ, "mask": MASK, "length": LENGTH,
        "action": (mean + 0.8 * sign * np.exp(logstd)).astype(np.float32),
        "reward": np.where(MASK > 0, rng.normal(size=(2, 5)), 7.0).astype(np.float32),
        "value": np.where(MASK > 0, rng.normal(size=(2, 5)), -3.0).astype(np.float32),
        "next_value": rng.normal(size=(2, 5)).astype(np.float32),
        "terminated": terminated, "done": done,
        "policy_mean": (mean + stale * rng.normal(size=mean.shape)).astype(np.float32),
        "policy_logstd": logstd.astype(np.float32)}


def _n_step_returns(batch):
    """G_t = r_t + discount * (1 - terminated_t) * (G_{t+1}, or the value after step t
    where its episode or the row ends), per row from its last valid step back; NumPy."""
    returns = np.zeros((2, 5))
    for row, length in enumerate(LENGTH):
        following = 0.0
        for t in reversed(range(length)):
            if batch["done"][row, t] or t == length - 1:
                following = batch["next_value"][row, t]
            following = batch["reward"][row, t] + DISCOUNT * (
                1.0 - batch["terminated"][row, t]) * following
            returns[row, t] = following
    return returns


@pytest.mark.parametrize("value_coef, entropy_coef", [(0.5, 0.0), (0.25, 0.3)])
def test_acted_by_its_own_policy_it_learns_n_step_returns_with_the_papers_loss(
        value_coef, entropy_coef):
    """pi = mu: the weights are 1, the targets the n-step returns G_t (cut at episode ends,
    bootstrapped where an episode was truncated and at the row's end), the advantages
    G_t - V(s_t); the loss is -mean(A log pi(a|s)) + value_coef * mean((G - V(s))^2) / 2 -
    entropy_coef * mean(H), over the valid steps, on the networks before the update."""
    algo = _algorithm(value_coef=value_coef, entropy_coef=entropy_coef)
    batch = _batch(algo)
    mean, logstd = _params(algo.networks, batch["observ"])
    value_now = algo.networks.value(batch["observ"]).numpy()
    returns = _n_step_returns(batch)
    advantage = returns - batch["value"]
    entropy = gaussian_numpy.entropy(logstd)
    want_loss = (-_valid_mean(advantage * _log_prob(batch["action"], mean, logstd))
                 + value_coef * 0.5 * _valid_mean((returns - value_now) ** 2)
                 - entropy_coef * _valid_mean(entropy))

    got = algo.update({key: tf.constant(value) for key, value in batch.items()})

    np.testing.assert_allclose(got["advantage"].numpy() * MASK, advantage * MASK,
                               rtol=1e-5, atol=1e-5)
    assert float(got["mean_return"]) == pytest.approx(_valid_mean(returns), rel=1e-5)
    assert float(got["mean_rho"]) == pytest.approx(1.0, abs=1e-6)
    assert float(got["loss"]) == pytest.approx(want_loss, rel=1e-5)
    assert float(got["value_loss"]) == pytest.approx(
        0.5 * _valid_mean((returns - value_now) ** 2), rel=1e-5)
    assert float(got["kl"]) > 0, "the update changed the policy"


def test_acted_by_an_older_policy_its_weights_are_pi_over_the_stored_mu():
    """The importance weights are those of the current policy over the stored behaviour
    policy (`policy_<param>`), not the reverse: the advantages are V-trace's with
    log pi - log mu computed here."""
    algo = _algorithm()
    batch = _batch(algo, seed=1, stale=0.5)
    mean, logstd = _params(algo.networks, batch["observ"])
    log_ratio = (_log_prob(batch["action"], mean, logstd)
                 - _log_prob(batch["action"], batch["policy_mean"], batch["policy_logstd"]))
    _, want = vtrace(
        tf.constant(log_ratio, tf.float32), batch["reward"], batch["value"],
        batch["next_value"], batch["terminated"], batch["done"], LENGTH,
        discount=DISCOUNT)
    got = algo.update({key: tf.constant(value) for key, value in batch.items()})
    np.testing.assert_allclose(got["advantage"].numpy() * MASK, want.numpy() * MASK,
                               rtol=1e-5, atol=1e-5)
    assert float(got["mean_rho"]) == pytest.approx(_valid_mean(np.exp(log_ratio)), rel=1e-5)
    assert abs(float(got["mean_rho"]) - 1.0) > 0.05, "the behaviour is not the current one"
    clipped = _valid_mean(np.exp(log_ratio) > algo._config.rho_bar)
    assert 0 < clipped < 1
    assert float(got["rho_clipped"]) == pytest.approx(clipped, rel=1e-6)


def _reference_gradients(algo, batch, value_coef, entropy_coef):
    """{network: its variables' gradients} of IMPALA's loss with weights 1 (pi = mu), on
    losses written here from the NumPy n-step returns: the policy loss's on the policy's
    variables, `value_coef` times the value loss's on the value network's."""
    returns = _n_step_returns(batch).astype(np.float32)
    advantage = returns - batch["value"]
    networks, mask = algo.networks, tf.constant(MASK)

    def valid_mean(values):
        return tf.reduce_sum(values * mask) / tf.reduce_sum(mask)

    with tf.GradientTape(persistent=True) as tape:
        params, _ = networks.policy(batch["observ"], tf.zeros((2, 0)))
        mean, logstd = params["mean"], params["logstd"]
        log_prob = tf.reduce_sum(
            -0.5 * tf.square((batch["action"] - mean) / tf.exp(logstd)) - logstd
            - 0.5 * np.log(2 * np.pi), -1)
        entropy = tf.reduce_sum(logstd + 0.5 * np.log(2 * np.pi * np.e), -1)
        policy_loss = valid_mean(-advantage * log_prob - entropy_coef * entropy)
        value_loss = value_coef * 0.5 * valid_mean(
            tf.square(returns - networks.value(batch["observ"])))
    return {name: [g.numpy() for g in tape.gradient(loss, network.trainable_variables)]
            for name, loss, network in (("policy", policy_loss, networks.policy),
                                        ("value", value_loss, networks.value))}


def _global_norm(arrays):
    return float(np.sqrt(sum(np.sum(np.square(a, dtype=np.float64)) for a in arrays)))


def test_the_gradient_norm_of_each_network_is_its_part_of_the_joint_gradient():
    """`policy_gradient_norm` is the global norm of the policy loss's gradient on the
    policy's variables, `value_gradient_norm` that of `value_coef` times the value loss's on
    the value network's, each before clipping (here at 1e-3, far below both)."""
    value_coef, entropy_coef = 0.5, 0.1
    algo = _algorithm(value_coef=value_coef, entropy_coef=entropy_coef,
                      max_gradient_norm=1e-3)
    batch = _batch(algo)
    want = {name: _global_norm(gradients) for name, gradients in
            _reference_gradients(algo, batch, value_coef, entropy_coef).items()}

    got = algo.update({key: tf.constant(value) for key, value in batch.items()})
    for name in ("policy", "value"):
        assert float(got[name + "_gradient_norm"]) == pytest.approx(want[name], rel=1e-4)
    assert float(got["gradient_norm"]) == pytest.approx(np.hypot(*want.values()), rel=1e-4)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_one_update_moves_log_probabilities_with_the_advantage(sign):
    """Rewards of `sign` at every step, values and bootstraps 0, no value loss: every
    advantage has the sign of the reward, and one update raises (positive) or lowers
    (negative) the mean log-probability of the actions taken."""
    algo = _algorithm(value_coef=0.0)
    batch = _batch(algo, seed=4)
    batch.update(reward=sign * MASK, value=np.zeros((2, 5), np.float32),
                 next_value=np.zeros((2, 5), np.float32))
    before = _params(algo.networks, batch["observ"])
    got = algo.update({key: tf.constant(value) for key, value in batch.items()})
    assert (sign * got["advantage"].numpy()[MASK > 0] > 0).all()
    after = _params(algo.networks, batch["observ"])
    change = _log_prob(batch["action"], *after) - _log_prob(batch["action"], *before)
    assert sign * _valid_mean(change) > 1e-4


def test_a_config_without_rollout_length_is_refused():
    with pytest.raises(ValueError, match="set rollout_length"):
        _algorithm(rollout_length=None)


@pytest.mark.parametrize("name", ["impala", "appo"])
def test_c_bar_above_rho_bar_is_a_config_error(name):
    """V-trace's analysis assumes rho_bar >= c_bar (Espeholt et al., section 4.1): both
    algorithms refuse the other order, naming both keys; equal levels are accepted."""
    from batchrl.algorithms import APPO

    algorithm = {"impala": IMPALA, "appo": APPO}[name]
    settings = {"algorithm": name, "policy_layers": [4], "value_layers": [4],
                "rollout_length": 5}
    with pytest.raises(configs.ConfigError,
                       match=r"'c_bar' \(1.0\) and 'rho_bar' \(0.5\): V-trace assumes"):
        gaussian_numpy.algorithm_on_mocks(
            algorithm, {**settings, "rho_bar": 0.5, "c_bar": 1.0}, max_length=50)
    gaussian_numpy.algorithm_on_mocks(
        algorithm, {**settings, "rho_bar": 0.5, "c_bar": 0.5}, max_length=50)


def spread_batch(algo):
    """`_batch` acted by an older policy whose ratios pi / mu spread around 1 (0.53 to 4.1,
    some between 0.5 and 1), and the same batch with the log-ratio computed here (NumPy)
    and the keys of `test_vtrace._reference`."""
    batch = _batch(algo, seed=5, stale=0.2)
    mean, logstd = _params(algo.networks, batch["observ"])
    log_ratio = (_log_prob(batch["action"], mean, logstd)
                 - _log_prob(batch["action"], batch["policy_mean"], batch["policy_logstd"]))
    ratio = np.exp(log_ratio)[MASK > 0]
    assert (ratio > 1).any() and ((ratio > 0.5) & (ratio < 1)).any()
    return batch, dict(
        log_ratio=log_ratio, length=LENGTH,
        **{key: batch[key] for key in ("reward", "value", "next_value", "terminated", "done")})


def test_rho_bar_and_c_bar_truncate_where_eq_1_puts_them():
    """rho_bar 1.0 and c_bar 0.5 (different levels; every other test has 1.0 for both)
    with ratios spread around 1: the targets are eq. 1's with rho_s = min(1.0, pi / mu) in
    the temporal differences and c_s = min(0.5, pi / mu) in the trace, the advantages
    section 4.2's weighted by min(rho_bar, pi / mu) (NumPy sums,
    `test_vtrace._reference`); the two levels swapped give other values."""
    algo = _algorithm(rho_bar=1.0, c_bar=0.5)
    batch, sums = spread_batch(algo)
    target, advantage = _reference(sums, DISCOUNT, 1.0, 1.0, 0.5, 1.0)
    swapped, _ = _reference(sums, DISCOUNT, 1.0, 0.5, 1.0, 1.0)
    assert np.abs(swapped - target).max() > 0.05, "the swap changes the targets"

    got = algo.update({key: tf.constant(value) for key, value in batch.items()})

    np.testing.assert_allclose(got["advantage"].numpy() * MASK, advantage,
                               rtol=1e-5, atol=1e-5)
    assert float(got["mean_return"]) == pytest.approx(_valid_mean(target), rel=1e-5)


def test_a_value_optimizer_steps_the_value_networks_part_clipped_on_its_own():
    """With `value_optimizer`, plain SGD steps here: each network's variables move by its
    own learning rate times its part of the gradient, clipped to `max_gradient_norm` on
    its own global norm (the joint norm would cut the smaller part with the larger)."""
    value_coef, entropy_coef, clip = 0.5, 0.0, 0.05
    algo = _algorithm(value_coef=value_coef, entropy_coef=entropy_coef, policy_lr=0.1,
                      value_lr=0.2, max_gradient_norm=clip, optimizer={"type": "sgd"},
                      value_optimizer={"type": "sgd"})
    batch = _batch(algo)
    gradients = _reference_gradients(algo, batch, value_coef, entropy_coef)
    networks = {"policy": algo.networks.policy, "value": algo.networks.value}
    before = {name: [v.numpy() for v in network.trainable_variables]
              for name, network in networks.items()}
    algo.update({key: tf.constant(value) for key, value in batch.items()})
    for name, rate in (("policy", 0.1), ("value", 0.2)):
        norm = _global_norm(gradients[name])
        assert norm > clip, "clipped"
        for start, gradient, variable in zip(before[name], gradients[name],
                                             networks[name].trainable_variables, strict=True):
            np.testing.assert_allclose(variable.numpy(), start - rate * gradient * clip / norm,
                                       rtol=1e-4, atol=1e-6)
    assert "value_optimizer" in algo.checkpoint_state


def test_a_value_optimizer_with_shared_layers_is_a_config_error():
    from batchrl import networks
    from batchrl.environments.in_graph import InGraphBatchEnv
    from batchrl.environments.local import BatchEnv
    from batchrl.environments.mock import MockEnvironment
    from batchrl.errors import ConfigError

    config = configs.load("default", {
        "algorithm": "impala", "rollout_length": 5, "share_layers": True,
        "network": [{"type": "dense", "units": 8}], "value_optimizer": {"type": "adam"}})
    config.update(network=networks.constructor(config.network), max_length=10)
    batch_env = InGraphBatchEnv(BatchEnv([MockEnvironment((3,), (2,), 2, 10)], blocking=True))
    with pytest.raises(ConfigError, match="^config key 'value_optimizer': impala's networks "
                                          "share their layers"):
        IMPALA(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
               tf.Variable(False), config)

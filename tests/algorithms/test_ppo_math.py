"""GAE, losses, KL penalty adaptation, distributions and episode memory against NumPy."""

import math

import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms import advantage
from batchrl.algorithms.ppo import losses
from batchrl.memories.episode import EpisodeMemory
from batchrl.networks.distributions import Categorical, DiagonalGaussian


def _numpy_gae(reward, value, bootstrap, length, discount, lam):
    advantages = np.zeros_like(reward)
    for episode in range(len(reward)):
        running = 0.0
        for t in reversed(range(length[episode])):
            following = bootstrap[episode] if t == length[episode] - 1 else value[episode, t + 1]
            delta = reward[episode, t] + discount * following - value[episode, t]
            running = delta + discount * lam * running
            advantages[episode, t] = running
    mask = np.arange(reward.shape[1])[None] < length[:, None]
    return advantages, (advantages + value) * mask


@pytest.mark.parametrize("discount, lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_generalized_advantage_matches_numpy(discount, lam):
    rng = np.random.default_rng(0)
    reward = rng.normal(size=(4, 7)).astype(np.float32)
    value = rng.normal(size=(4, 7)).astype(np.float32)
    bootstrap = rng.normal(size=4).astype(np.float32)
    length = np.array([7, 3, 1, 5], np.int32)
    got_advantage, got_target = advantage.generalized_advantage(
        reward, value, bootstrap, length, discount, lam)
    want_advantage, want_target = _numpy_gae(reward, value, bootstrap, length, discount, lam)
    np.testing.assert_allclose(got_advantage.numpy(), want_advantage, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_target.numpy(), want_target, rtol=1e-5, atol=1e-5)


def test_truncated_episode_bootstraps_and_terminated_does_not():
    # One step of reward 1 in a state of value 0: the advantage is 1 + discount * bootstrap.
    reward = np.ones((2, 3), np.float32)
    value = np.zeros((2, 3), np.float32)
    length = np.array([1, 1], np.int32)
    final_value = np.array([10.0, 10.0], np.float32)
    not_terminal = np.array([1.0, 0.0], np.float32)  # Truncated, terminated.
    got, _ = advantage.generalized_advantage(
        reward, value, final_value * not_terminal, length, 0.9, 0.95)
    np.testing.assert_allclose(got.numpy()[:, 0], [1.0 + 0.9 * 10.0, 1.0])
    np.testing.assert_array_equal(got.numpy()[:, 1:], 0.0)


def test_masked_mean_ignores_padding():
    values = np.array([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]], np.float32)
    mask = advantage.sequence_mask(np.array([2, 1]), 3)
    assert float(advantage.masked_mean(values, mask)) == pytest.approx(2.0)
    np.testing.assert_allclose(advantage.masked_mean(values, mask, axis=1).numpy(), [1.5, 3.0])


@pytest.mark.parametrize("kl, expected", [
    (0.02, 1.5),       # Above 1.3 * target: increase.
    (0.0131, 1.5),
    (0.0129, 1.0),     # Within [0.7, 1.3] * target: unchanged.
    (0.0071, 1.0),
    (0.0069, 1 / 1.5),  # Below 0.7 * target: decrease.
    (0.0, 1 / 1.5),
])
def test_kl_penalty_adaptation(kl, expected):
    assert float(losses.adapted_penalty(1.0, kl, 0.01)) == pytest.approx(expected)


def test_kl_penalty_stays_within_bounds():
    assert float(losses.adapted_penalty(1e-6, 0.0, 0.01)) == pytest.approx(1e-6)
    assert float(losses.adapted_penalty(1e6, 1.0, 0.01)) == pytest.approx(1e6)


def test_policy_loss_terms():
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    log_prob = np.log(np.array([[2.0, 1.0, 9.0], [0.5, 9.0, 9.0]], np.float32))
    old_log_prob = np.zeros((2, 3), np.float32)
    adv = np.array([[1.0, -1.0, 5.0], [2.0, 5.0, 5.0]], np.float32)
    kl = np.array([[0.01, 0.03, 9.0], [0.05, 9.0, 9.0]], np.float32)
    result = losses.policy_loss(log_prob, old_log_prob, adv, kl, mask, penalty=2.0,
                                kl_target=0.01, kl_cutoff_factor=2.0, kl_cutoff_coef=1000.0)
    surrogate = -(2.0 * 1.0 + 1.0 * -1.0 + 0.5 * 2.0) / 3
    mean_kl = (0.01 + 0.03 + 0.05) / 3
    episode_kl = np.array([0.02, 0.05])  # The cut-off is 0.02: only episode 2 exceeds it.
    cutoff = 1000.0 * np.mean(np.maximum(episode_kl - 0.02, 0.0) ** 2)
    assert float(result["surrogate"]) == pytest.approx(surrogate, rel=1e-5)
    assert float(result["kl"]) == pytest.approx(mean_kl, rel=1e-5)
    assert float(result["kl_penalty"]) == pytest.approx(2.0 * mean_kl, rel=1e-5)
    assert float(result["cutoff_penalty"]) == pytest.approx(cutoff, rel=1e-4)
    assert float(result["cutoff_count"]) == 1.0
    assert float(result["loss"]) == pytest.approx(surrogate + 2.0 * mean_kl + cutoff, rel=1e-5)
    entropy = np.array([[1.0, 3.0, 50.0], [2.0, 50.0, 50.0]], np.float32)
    bonus = losses.policy_loss(log_prob, old_log_prob, adv, kl, mask, penalty=2.0,
                               kl_target=0.01, kl_cutoff_factor=2.0, kl_cutoff_coef=1000.0,
                               entropy=entropy, entropy_coef=0.1)
    # The entropy bonus: 0.1 times the mean entropy over the valid steps, subtracted.
    assert float(bonus["loss"]) == pytest.approx(float(result["loss"]) - 0.1 * 2.0, rel=1e-5)


def test_clipped_surrogate_and_its_gradient():
    """arXiv:1707.06347, eq. 7, with epsilon 0.2: ratio 2.0 with A = 1 is clipped to 1.2
    (no gradient); 1.0 with A = -1 is inside the range; 0.5 with A = 2 keeps r A = 1.0,
    the smaller of it and 0.8 A = 1.6 (with gradient); padded steps count for nothing."""
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    log_prob = tf.Variable(np.log(np.array([[2.0, 1.0, 9.0], [0.5, 9.0, 9.0]], np.float32)))
    adv = np.array([[1.0, -1.0, 5.0], [2.0, 5.0, 5.0]], np.float32)
    kl = np.array([[0.01, 0.03, 9.0], [0.05, 9.0, 9.0]], np.float32)
    with tf.GradientTape() as tape:
        result = losses.policy_loss(log_prob, np.zeros((2, 3), np.float32), adv, kl, mask,
                                    penalty=2.0, kl_target=0.01, kl_cutoff_factor=2.0,
                                    kl_cutoff_coef=1000.0, clip_ratio=0.2)
    surrogate = -(1.2 * 1.0 + 1.0 * -1.0 + 0.5 * 2.0) / 3
    assert float(result["surrogate"]) == pytest.approx(surrogate, rel=1e-5)
    assert float(result["loss"]) == pytest.approx(surrogate, rel=1e-5)  # No KL terms.
    assert float(result["kl_penalty"]) == float(result["cutoff_penalty"]) == 0.0
    assert float(result["kl"]) == pytest.approx((0.01 + 0.03 + 0.05) / 3, rel=1e-5)
    # d(-r A / 3) / d log r = -r A / 3 where unclipped; 0 where clipped or padded.
    gradient = tape.gradient(result["loss"], log_prob).numpy()
    np.testing.assert_allclose(gradient, [[0.0, 1.0 / 3, 0.0], [-1.0 / 3, 0.0, 0.0]],
                               rtol=1e-5, atol=1e-7)


def test_value_loss():
    mask = np.array([[1, 0]], np.float32)
    got = losses.value_loss(np.array([[1.0, 5.0]], np.float32),
                            np.array([[3.0, 0.0]], np.float32), mask)
    assert float(got) == pytest.approx(0.5 * 4.0)


def test_diagonal_gaussian_against_numpy():
    rng = np.random.default_rng(2)
    mean, other_mean = rng.normal(size=(2, 5, 3)).astype(np.float32)
    logstd, other_logstd = (rng.normal(size=(2, 5, 3)) * 0.3).astype(np.float32)
    action = rng.normal(size=(5, 3)).astype(np.float32)
    p = DiagonalGaussian({"mean": mean, "logstd": logstd})
    q = DiagonalGaussian({"mean": other_mean, "logstd": other_logstd})
    std, other_std = np.exp(logstd), np.exp(other_logstd)
    log_prob = np.sum(-0.5 * ((action - mean) / std) ** 2 - logstd - 0.5 * math.log(2 * math.pi),
                      -1)
    entropy = np.sum(logstd + 0.5 * math.log(2 * math.pi * math.e), -1)
    kl = np.sum(np.log(other_std / std) + (std ** 2 + (mean - other_mean) ** 2)
                / (2 * other_std ** 2) - 0.5, -1)
    np.testing.assert_allclose(p.log_prob(action).numpy(), log_prob, rtol=1e-5)
    np.testing.assert_allclose(p.entropy().numpy(), entropy, rtol=1e-5)
    np.testing.assert_allclose(p.kl(q).numpy(), kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(p.kl(p).numpy(), 0.0, atol=1e-6)
    samples = DiagonalGaussian({"mean": np.full((20000, 1), 2.0, np.float32),
                                "logstd": np.full((20000, 1), math.log(0.5), np.float32)})
    drawn = samples.sample(tf.random.Generator.from_seed(0)).numpy()
    assert drawn.mean() == pytest.approx(2.0, abs=0.02)
    assert drawn.std() == pytest.approx(0.5, abs=0.02)


def test_episode_memory_append_replace_clear():
    memory = EpisodeMemory({"x": ((2,), tf.float32), "a": ((), tf.int32)}, capacity=3,
                           max_length=4)
    memory.append({"x": np.ones((2, 2), np.float32), "a": np.array([7, 8], np.int32)}, [0, 2])
    memory.append({"x": np.full((1, 2), 2.0, np.float32), "a": np.array([9], np.int32)}, [0])
    episodes, length = memory.data()
    np.testing.assert_array_equal(length.numpy(), [2, 0, 1])
    np.testing.assert_array_equal(episodes["a"].numpy()[0, :2], [7, 9])
    np.testing.assert_array_equal(episodes["x"].numpy()[0, 1], [2.0, 2.0])
    rows, row_length = memory.data([0])
    memory.replace(rows, row_length, [1])
    np.testing.assert_array_equal(memory.length.numpy(), [2, 2, 1])
    np.testing.assert_array_equal(memory.data([1])[0]["a"].numpy()[0, :2], [7, 9])
    memory.clear([0])
    np.testing.assert_array_equal(memory.length.numpy(), [0, 2, 1])
    memory.clear()
    np.testing.assert_array_equal(memory.length.numpy(), [0, 0, 0])


def test_episode_memory_rejects_episodes_longer_than_max_length():
    memory = EpisodeMemory({"a": ((), tf.int32)}, capacity=1, max_length=1)
    memory.append({"a": np.array([1], np.int32)}, [0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_length"):
        memory.append({"a": np.array([2], np.int32)}, [0])


def test_categorical_against_numpy():
    rng = np.random.default_rng(3)
    logits, other_logits = rng.normal(size=(2, 6, 4)).astype(np.float32)
    action = rng.integers(0, 4, size=6).astype(np.int32)
    p = Categorical({"logits": logits})
    q = Categorical({"logits": other_logits})

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    log_p, log_q = log_softmax(logits), log_softmax(other_logits)
    np.testing.assert_allclose(p.log_prob(action).numpy(), log_p[np.arange(6), action],
                               rtol=1e-5)
    np.testing.assert_allclose(p.entropy().numpy(), -(np.exp(log_p) * log_p).sum(-1),
                               rtol=1e-5)
    np.testing.assert_allclose(p.kl(q).numpy(), (np.exp(log_p) * (log_p - log_q)).sum(-1),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(p.mode().numpy(), logits.argmax(-1))
    counts = np.bincount(
        Categorical({"logits": np.log(np.tile([[0.1, 0.2, 0.7]], (30000, 1))).astype(
            np.float32)}).sample(tf.random.Generator.from_seed(1)).numpy(), minlength=3)
    np.testing.assert_allclose(counts / 30000, [0.1, 0.2, 0.7], atol=0.01)


def _poisoned(values, mask, poison):
    """`values` with `poison` (NaN or an infinity) at the masked-out entries."""
    return np.where(mask > 0, values, np.float32(poison)).astype(np.float32)


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_losses_ignore_non_finite_values_at_masked_steps(poison):
    """A NaN or an infinity at a padded step (stale memory) in any input of the policy loss,
    or in the value targets, changes neither PPO's losses nor their gradients: they equal
    those of zeros there, and the padded steps' gradients are 0. A product with the mask
    would give `inf * 0 = NaN`. (The value predictions are the network's, finite.)"""
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    inputs = {name: rng.normal(size=(2, 4)).astype(np.float32) * scale for name, scale in (
        ("log_prob", 0.5), ("old_log_prob", 0.5), ("advantage", 1.0), ("kl", 0.0),
        ("entropy", 1.0), ("target", 1.0))}
    inputs["kl"] = np.abs(rng.normal(size=(2, 4))).astype(np.float32) * 0.03

    def results(inputs):
        tensors = {name: tf.constant(value) for name, value in inputs.items()}
        prediction = tf.constant(np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(2, 4))
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([*tensors.values(), prediction])
            policy = losses.policy_loss(
                tensors["log_prob"], tensors["old_log_prob"], tensors["advantage"],
                tensors["kl"], mask, penalty=2.0, kl_target=0.01, kl_cutoff_factor=2.0,
                kl_cutoff_coef=1000.0, entropy=tensors["entropy"], entropy_coef=0.1)
            value = losses.value_loss(prediction, tensors["target"], mask)
        gradients = {name: tape.gradient(policy["loss"], tensors[name]).numpy()
                     for name in ("log_prob", "kl", "entropy")}
        gradients["value"] = tape.gradient(value, prediction).numpy()
        return {"loss": float(policy["loss"]), "surrogate": float(policy["surrogate"]),
                "value_loss": float(value)}, gradients

    clean = {name: np.where(mask > 0, value, 0.0).astype(np.float32)
             for name, value in inputs.items()}
    want, want_gradients = results(clean)
    for name in inputs:
        poisoned = dict(clean, **{name: _poisoned(clean[name], mask, poison)})
        got, gradients = results(poisoned)
        assert got == pytest.approx(want, rel=1e-6), name
        for key, gradient in gradients.items():
            assert np.isfinite(gradient).all(), (name, key)
            np.testing.assert_allclose(gradient, want_gradients[key], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name} {key}")
            assert not gradient[mask == 0].any(), (name, key)


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_masked_mean_and_generalized_advantage_ignore_non_finite_padding(poison):
    """Padding beyond an episode's length may hold anything: GAE, whose sums run backwards
    over time, must not carry a NaN from the padding into the valid steps."""
    rng = np.random.default_rng(1)
    length = np.array([4, 2], np.int32)
    mask = advantage.sequence_mask(length, 6).numpy()
    reward = rng.normal(size=(2, 6)).astype(np.float32)
    value = rng.normal(size=(2, 6)).astype(np.float32)
    bootstrap = rng.normal(size=2).astype(np.float32)
    assert float(advantage.masked_mean(_poisoned(reward, mask, poison), mask)) == (
        pytest.approx(float(np.mean(reward[mask > 0])), rel=1e-6))
    got = advantage.generalized_advantage(
        _poisoned(reward, mask, poison), _poisoned(value, mask, poison), bootstrap, length,
        0.9, 0.95)
    want = _numpy_gae(reward, value, bootstrap, length, 0.9, 0.95)
    for got_part, want_part in zip(got, want, strict=True):
        np.testing.assert_allclose(got_part.numpy(), want_part, rtol=1e-5, atol=1e-6)
    normalized = advantage.normalize(_poisoned(reward, mask, poison), mask).numpy()
    valid = reward[mask > 0]
    np.testing.assert_allclose(normalized[mask > 0], (valid - valid.mean()) / valid.std(),
                               rtol=1e-4, atol=1e-5)
    assert not normalized[mask == 0].any()


@pytest.mark.parametrize("discount, lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_rollout_advantage_equals_gae_of_the_episodes_it_spans(discount, lam):
    """A rollout row cut at its episode ends gives the whole-episode GAE of each piece, each
    bootstrapped from the value after its last step: 0 when it terminated, V(s') when it
    was truncated or is still running at the row's end."""
    rng = np.random.default_rng(1)
    rows, time = 3, 11
    reward, value, next_value = (rng.normal(size=(rows, time)).astype(np.float32)
                                 for _ in range(3))
    done = rng.random((rows, time)) < 0.25
    terminated = done & (rng.random((rows, time)) < 0.5)
    done[0, -1] = terminated[0, -1] = True  # A row ending in a terminal state.
    length = np.array([time, time, time - 3], np.int32)  # The last row padded.
    advantage_, target = (x.numpy() for x in advantage.rollout_advantage(
        reward, value, next_value, terminated, done, length, discount, lam))
    done[2, length[2] - 1:] = True  # Where the test cuts the padded row.
    for row in range(rows):
        ends = [t for t in range(length[row]) if done[row, t]]
        starts = [0] + [t + 1 for t in ends if t + 1 < length[row]]
        for start in starts:
            end = next((t for t in ends if t >= start), length[row] - 1)
            piece = end - start + 1
            bootstrap = 0.0 if terminated[row, end] else next_value[row, end]
            expected, _ = _numpy_gae(reward[None, row, start:end + 1],
                                     value[None, row, start:end + 1],
                                     np.array([bootstrap]), np.array([piece]), discount, lam)
            np.testing.assert_allclose(advantage_[row, start:end + 1], expected[0], atol=1e-5)
    valid = np.arange(time)[None] < length[:, None]
    np.testing.assert_allclose(target, (advantage_ + value) * valid, atol=1e-6)
    np.testing.assert_array_equal(advantage_[~valid], 0.0)

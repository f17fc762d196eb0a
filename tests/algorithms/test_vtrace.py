"""V-trace (`batchrl.algorithms.vtrace`) against the sums of Espeholt et al.,
arXiv:1802.01561, eq. 1 and section 4.2, written out in NumPy step by step; and on-policy
against GAE's lambda-returns."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms.advantage import rollout_advantage
from batchrl.algorithms.vtrace import vtrace


def _rollouts(seed, rows=4, time=9):
    rng = np.random.default_rng(seed)
    terminated = rng.random((rows, time)) < 0.15
    truncated = ~terminated & (rng.random((rows, time)) < 0.1)
    return dict(
        log_ratio=rng.normal(scale=0.7, size=(rows, time)).astype(np.float32),
        reward=rng.normal(size=(rows, time)).astype(np.float32),
        value=rng.normal(size=(rows, time)).astype(np.float32),
        next_value=rng.normal(size=(rows, time)).astype(np.float32),
        terminated=terminated, done=terminated | truncated,
        length=np.array([time, time - 2, 1, time - 4], np.int32)[:rows])


def _ends(batch, row, t):
    """Step t of `row` is the last of its episode or of the row."""
    return bool(batch["done"][row, t]) or t == batch["length"][row] - 1


def _after(batch, row, t):
    """V(s'_t): the next step's value inside an episode, else `next_value`."""
    return batch["next_value"][row, t] if _ends(batch, row, t) else batch["value"][row, t + 1]


def _reference(batch, discount, lam, rho_bar, c_bar, pg_rho_bar):
    """eq. 1 as a sum over the steps to the end of the episode piece, and the advantage of
    section 4.2 (unweighted with `pg_rho_bar` None), per row and step, in float64."""
    ratio = np.exp(batch["log_ratio"].astype(np.float64))
    keep = 1.0 - batch["terminated"]
    target = np.zeros(ratio.shape)
    advantage = np.zeros(ratio.shape)
    for row in range(ratio.shape[0]):
        delta = [min(rho_bar, ratio[row, t]) * (
            batch["reward"][row, t] + discount * keep[row, t] * _after(batch, row, t)
            - batch["value"][row, t]) for t in range(batch["length"][row])]
        for s in range(batch["length"][row]):
            total, weight, t = 0.0, 1.0, s
            while True:
                total += weight * delta[t]
                if _ends(batch, row, t):
                    break
                weight *= discount * lam * min(c_bar, ratio[row, t])
                t += 1
            target[row, s] = batch["value"][row, s] + total
        for s in range(batch["length"][row]):
            following = (_after(batch, row, s) if _ends(batch, row, s)
                         else target[row, s + 1])
            weight = 1.0 if pg_rho_bar is None else min(pg_rho_bar, ratio[row, s])
            advantage[row, s] = weight * (
                batch["reward"][row, s] + discount * keep[row, s] * following
                - batch["value"][row, s])
    return target, advantage


@pytest.mark.parametrize("discount, lam, rho_bar, c_bar, pg_rho_bar", [
    (0.99, 1.0, 1.0, 1.0, 1.0), (0.9, 0.95, 2.0, 0.8, 1.5), (0.97, 0.5, 0.5, 3.0, 0.7),
    (0.9, 0.95, 2.0, 0.8, None)])
def test_vtrace_matches_the_papers_sums(discount, lam, rho_bar, c_bar, pg_rho_bar):
    batch = _rollouts(seed=int(lam * 100))
    target, advantage = vtrace(
        **{key: tf.constant(value) for key, value in batch.items()}, discount=discount,
        gae_lambda=lam, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    expected_target, expected_advantage = _reference(
        batch, discount, lam, rho_bar, c_bar, pg_rho_bar)
    np.testing.assert_allclose(target.numpy(), expected_target, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantage.numpy(), expected_advantage, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_targets_are_gaes_lambda_returns():
    batch = _rollouts(seed=3)
    batch["log_ratio"] = np.zeros_like(batch["log_ratio"])
    tensors = {key: tf.constant(value) for key, value in batch.items()}
    target, _ = vtrace(**tensors, discount=0.95, gae_lambda=0.9)
    _, gae_target = rollout_advantage(
        tensors["reward"], tensors["value"], tensors["next_value"], tensors["terminated"],
        tensors["done"], tensors["length"], 0.95, 0.9)
    np.testing.assert_allclose(target.numpy(), gae_target.numpy(), rtol=1e-5, atol=1e-5)

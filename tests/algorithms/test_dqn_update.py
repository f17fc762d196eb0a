"""DQN's update rule against NumPy (Mnih et al. 2015; van Hasselt et al. 2016): one
`_update_step` on a hand-built batch of masked observations, the reference computed from
the weights read out of the Q network and its (perturbed) target before the update."""

import gymnasium as gym
import numpy as np
import pytest

from batchrl.algorithms.dqn import DQN
from batchrl.environments.application import ApplicationBatchEnv
from batchrl.spaces.nested import FlatObservationSpace
from tests import off_policy_numpy as ref

BATCH, ACTIONS = 8, 5
GAMMA = 0.985  # default.yaml's discount.
# A Dict observation: Gymnasium sorts its keys, so the flat observation is the mask (5
# elements) then the values (5).
SPACE = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(ACTIONS),
                         "values": gym.spaces.Box(0.0, 1.0, (ACTIONS,), np.float32)})


def _observations(rng, masks):
    return np.concatenate([masks, rng.uniform(size=(BATCH, ACTIONS))], 1).astype(np.float32)


def _batch(seed=0):
    """Next observations whose masks forbid action 0 in rows 0-5 (the online network's
    favourite, see `update`), n-step discounts and terminations, unequal importance
    weights, rewards whose TD errors fall on both sides of Huber's delta = 1."""
    rng = np.random.default_rng(seed)
    masks = rng.random((BATCH, ACTIONS)) < 0.6
    masks[:, 1] = True  # At least one allowed action.
    next_masks = masks[::-1].copy()
    next_masks[:6, 0], next_masks[6:] = False, True
    return {
        "observ": _observations(rng, masks),
        "action": np.array([1, 1, 2, 1, 3, 1, 4, 1], np.int32),
        "reward": np.array([3.0, -2.5, 0.1, -0.2, 1.5, 0.0, -4.0, 0.3], np.float32),
        "discount": np.array([GAMMA, 0.0, GAMMA ** 3, GAMMA, 0.0, GAMMA ** 2, GAMMA, GAMMA],
                             np.float32),
        "nextob": _observations(rng, next_masks),
        "weight": rng.uniform(0.2, 1.0, BATCH).astype(np.float32),
    }


def _huber(error):
    return np.where(np.abs(error) < 1.0, 0.5 * error ** 2, np.abs(error) - 0.5)


@pytest.fixture(scope="module", params=[True, False], ids=["double_q", "max_q"])
def update(request):
    """DQN (the online network's bias favouring action 0, the target network a perturbed
    copy), its weights before one update, the batch, and the update's results."""
    batch_env = ApplicationBatchEnv(2, FlatObservationSpace(SPACE), gym.spaces.Discrete(ACTIONS))
    algo = ref.build(DQN, batch_env, batch_size=BATCH, double_q=request.param,
                     target_update_rate=0.25, target_update_every=1)
    q, target = algo.networks.policy, algo.checkpoint_state["target_policy"]
    q._advantage.bias.assign([4.0, 0.0, 0.0, 0.0, 0.0])
    for t, o in zip(target.variables, q.variables, strict=True):
        t.assign(o)
    ref.perturb(target, 0.5, seed=1)
    before = {"q": ref.q_network_weights(q), "target": ref.q_network_weights(target),
              "q_variables": ref.variables(q), "target_variables": ref.variables(target)}
    batch = _batch()
    diagnostics, td_error = algo._update_step(batch)
    results = {key: float(value) for key, value in diagnostics.items()}
    return algo, request.param, before, batch, results, td_error.numpy()


def test_loss_is_the_weighted_huber_error_to_the_masked_double_q_target(update):
    """mean(w Huber(Q(s, a) - y)). Catches: the target network removed (the online
    network evaluates); the argmax taken by the target network (double_q ignored); the mask
    dropped from the argmax (double_q) or from the target's values (max_q); the squared
    loss for Huber's; Huber's delta 2; the importance weights dropped; the config's
    discount past terminations."""
    _, double, before, batch, results, td_error = update
    allowed = batch["nextob"][:, :ACTIONS] > 0.5
    y, online, target, pick = ref.dqn_target(before["q"], before["target"], batch, allowed,
                                             double)
    rows = np.arange(BATCH)
    # The cases the batch is made of, so that each variant of the rule gives another loss:
    assert not allowed[rows, online.argmax(-1)].all()  # the mask matters
    assert not allowed[rows, target.argmax(-1)].all()
    assert (np.where(allowed, target, -np.inf).argmax(-1) != pick).any()  # who picks
    q = ref.q_network(before["q"], batch["observ"])[rows, batch["action"]]
    error = q - y
    assert (np.abs(error) > 1).any() and (np.abs(error) < 1).any()
    expected = (batch["weight"] * _huber(error)).mean()
    online_y = batch["reward"] + batch["discount"] * np.where(allowed, online, -np.inf).max(-1)
    for variant in ((batch["weight"] * 0.5 * error ** 2).mean(),  # squared loss
                    _huber(error).mean(),  # unweighted
                    (batch["weight"] * _huber(q - online_y)).mean()):  # online target
        assert abs(variant - expected) > 1e-2 * abs(expected)
    np.testing.assert_allclose(results["loss"], expected, rtol=1e-4)
    np.testing.assert_allclose(results["q"], q.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(td_error, np.abs(error), rtol=1e-4, atol=1e-5)


def test_target_network_moves_by_the_polyak_rate(update):
    """Q' <- 0.25 Q + 0.75 Q' after the step. Catches: the target not moved; the rates
    swapped."""
    algo, _, before, *_ = update
    online = ref.variables(algo.networks.policy)
    moved = ref.variables(algo.checkpoint_state["target_policy"])
    for value, old, new in zip(moved, before["target_variables"], online, strict=True):
        np.testing.assert_allclose(value, 0.25 * new + 0.75 * old, rtol=1e-5, atol=1e-6)
    assert not all(np.allclose(a, b) for a, b in zip(
        online, before["q_variables"], strict=True)), "the Q network stepped"

"""TD3's update rule against NumPy (Fujimoto et al. 2018, arXiv:1802.09477, algorithm 1):
two `_update_step`s on a hand-built batch with `policy_delay: 2`, the references computed
from the weights read out of the networks and from the same random draws (a clone of the
algorithm's generator)."""

import numpy as np
import pytest

from batchrl.algorithms.td3 import TD3
from tests import off_policy_numpy as ref

BATCH, ACTIONS = 8, 2
GAMMA = 0.985  # default.yaml's discount.
NOISE, NOISE_CLIP, RATE = 5.0, 0.05, 0.3


def _snapshot(algo):
    state = algo.checkpoint_state
    return {key: ref.variables(state[key])
            for key in ("policy", "critic", "target_policy", "target_critic")}


@pytest.fixture(scope="module")
def updates():
    """Two updates of TD3 (large smoothing noise, small clip, targets perturbed, the target
    actor's first action element pushed near 1 so that the smoothed action leaves [-1, 1],
    Q_2 made lower than Q_1): the weights and draws before each, and each update's
    results."""
    algo = ref.build(TD3, ref.mock_env(action_size=ACTIONS), batch_size=BATCH,
                     target_noise=NOISE, target_noise_clip=NOISE_CLIP, policy_delay=2,
                     target_update_rate=RATE, policy_lr=1e-3)
    state = algo.checkpoint_state
    ref.perturb(state["target_critic"], 0.3, seed=1)
    ref.perturb(state["target_policy"], 0.3, seed=2)
    state["target_policy"]._output.bias.assign([3.0, 0.0])
    state["critic"]._output.bias.assign([[[0.0]], [[-1.0]]])  # Q_2 < Q_1: min is Q_2.
    batch, steps = ref.box_batch(BATCH, ACTIONS, GAMMA), []
    for _ in range(2):
        before = {"variables": _snapshot(algo),
                  "actor": ref.deterministic_actor_weights(state["policy"]),
                  "target_actor": ref.deterministic_actor_weights(state["target_policy"]),
                  "critic": ref.twin_q_weights(state["critic"]),
                  "target_critic": ref.twin_q_weights(state["target_critic"]),
                  "noise": ref.clone(algo._random).normal([BATCH, ACTIONS]).numpy()}
        diagnostics, td_error = algo._update_step(batch)
        algo.updates.assign_add(1)  # As `_sampled_update` counts them.
        steps.append({"before": before, "td_error": td_error.numpy(),
                      "results": {key: float(value) for key, value in diagnostics.items()}})
    return algo, batch, steps, _snapshot(algo)


def test_critic_fits_the_target_with_clipped_smoothing_noise(updates):
    """y = r + gamma_k min_j Q'_j(s', clip(mu'(s') + clip(5 N, -0.05, 0.05), -1, 1)).
    Catches: the noise not clipped; the smoothed action not clipped to [-1, 1]; the online
    actor in place of the target actor; max over the target critics; the config's
    discount past terminations; the importance weights dropped."""
    _, batch, steps, _ = updates
    before, results = steps[0]["before"], steps[0]["results"]
    noise = NOISE * before["noise"]
    assert (np.abs(noise) > 10 * NOISE_CLIP).mean() > 0.8  # The clip matters.
    smoothed = ref.deterministic_actor(before["target_actor"], batch["nextob"]) + np.clip(
        noise, -NOISE_CLIP, NOISE_CLIP)
    assert (smoothed > 1).any()  # So does the clip to the action space.
    y = ref.td3_target(before["target_actor"], before["target_critic"], batch,
                       before["noise"], NOISE, NOISE_CLIP)
    error = ref.twin_q(before["critic"], batch["observ"], batch["action"]) - y
    assert (np.abs(error) > 1).any() and (np.abs(error) < 1).any()
    np.testing.assert_allclose(results["critic_loss"],
                               (batch["weight"] * error ** 2).mean(-1).sum(), rtol=1e-4)
    np.testing.assert_allclose(steps[0]["td_error"], np.abs(error).mean(0), rtol=1e-4,
                               atol=1e-5)


def test_q_summary_is_the_critics_estimate_of_the_batch_not_the_target(updates):
    """`q` is mean Q_1(s, a) of the batch before the critic's step (issue 42, item 8: it
    was the mean TD target). Catches: the target's mean (the code before the fix); Q_2's."""
    _, batch, steps, _ = updates
    for step in steps:
        q = ref.twin_q(step["before"]["critic"], batch["observ"], batch["action"])
        np.testing.assert_allclose(step["results"]["q"], q[0].mean(), rtol=1e-4)


def test_actor_and_targets_wait_for_the_policy_delay_then_move_by_polyak(updates):
    """policy_delay 2: after update 1 only the critics moved; after update 2 the actor
    stepped and each target is 0.3 online + 0.7 target. Catches: the delay ignored; the
    targets moved every update; the Polyak rates swapped; the target actor not moved."""
    _, _, steps, last = updates
    first, second = steps[0]["before"]["variables"], steps[1]["before"]["variables"]
    for key in ("policy", "target_policy", "target_critic"):
        for a, b in zip(first[key], second[key], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{key} moved at update 1")
    assert not all(np.allclose(a, b) for a, b in zip(
        first["critic"], second["critic"], strict=True)), "the critics stepped"
    assert not all(np.allclose(a, b) for a, b in zip(
        second["policy"], last["policy"], strict=True)), "the actor stepped at update 2"
    for target, online in (("target_policy", "policy"), ("target_critic", "critic")):
        for value, old, new in zip(last[target], second[target], last[online], strict=True):
            np.testing.assert_allclose(value, RATE * new + (1 - RATE) * old, rtol=1e-5,
                                       atol=1e-6, err_msg=target)


def test_one_actor_step_raises_the_first_critics_value_of_its_actions(updates):
    """At update 2 the actor's loss is -mean Q_1(s, mu(s)) with the critics after their
    step, and its step raises that mean. Catches: the loss's sign (the mean falls); Q_2 or
    min_i Q_i in place of Q_1."""
    algo, batch, steps, _ = updates
    critic = ref.twin_q_weights(algo.networks.critic)  # Not changed after its step.
    old_actor = steps[1]["before"]["actor"]
    new_actor = ref.deterministic_actor_weights(algo.networks.policy)
    old_q = ref.twin_q(critic, batch["observ"], ref.deterministic_actor(old_actor,
                                                                          batch["observ"]))
    new_q = ref.twin_q(critic, batch["observ"], ref.deterministic_actor(new_actor,
                                                                          batch["observ"]))
    np.testing.assert_allclose(steps[1]["results"]["actor_loss"], -old_q[0].mean(),
                               rtol=1e-4)
    assert new_q[0].mean() > old_q[0].mean() + 1e-4


def test_target_update_every_other_than_one_is_refused_at_build():
    """Issue 42, item 8: it was accepted and ignored (this fails on the code before)."""
    with pytest.raises(ValueError, match="'target_update_every' must be 1 for td3, got 3: .*"
                                         "policy_delay"):
        ref.build(TD3, ref.mock_env(), target_update_every=3)

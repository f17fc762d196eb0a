"""SAC's update rule against NumPy (Haarnoja et al. 2018, arXiv:1812.05905): one
`_update_step` on a hand-built batch, the references computed from the weights read out of
the networks and from the same random draws (a clone of the algorithm's generator)."""

import numpy as np
import pytest

from batchrl.algorithms.sac import SAC
from tests import off_policy_numpy as ref

BATCH, ACTIONS = 8, 2
GAMMA = 0.985  # default.yaml's discount.


@pytest.fixture(scope="module")
def update():
    """The algorithm (temperature 0.5, so log alpha is not 0; targets perturbed), what it
    held before one update, the batch, the draws, and the update's results."""
    algo = ref.build(SAC, ref.mock_env(action_size=ACTIONS), batch_size=BATCH,
                     init_temperature=0.5, target_update_rate=0.3)
    critic, target = algo.networks.critic, algo.checkpoint_state["target_critic"]
    ref.perturb(target, 0.3, seed=1)
    before = {
        "actor": ref.gaussian_actor_weights(algo.networks.policy),
        "critic": ref.twin_q_weights(critic), "target": ref.twin_q_weights(target),
        "critic_variables": ref.variables(critic), "target_variables": ref.variables(target),
        "log_alpha": float(algo.checkpoint_state["log_temperature"].numpy())}
    generator = ref.clone(algo._random)
    # The update's draws in its order: a' ~ pi(.|s') for the target, then a~ ~ pi(.|s).
    noise = [generator.normal([BATCH, ACTIONS]).numpy().astype(np.float64) for _ in range(2)]
    batch = ref.box_batch(BATCH, ACTIONS, GAMMA)
    diagnostics, td_error = algo._update_step(batch)
    results = {key: float(value) for key, value in diagnostics.items()}
    return algo, before, batch, noise, results, td_error.numpy()


def test_critic_loss_is_the_weighted_squared_error_to_the_clipped_double_q_soft_target(
        update):
    """Catches: max in place of min over the target critics; + alpha log pi in the target;
    the config's discount in place of the batch's (bootstrapping past terminations); the
    online critic in place of the target; the importance weights dropped; the 0.5."""
    _, before, batch, noise, results, td_error = update
    y = ref.sac_target(before["actor"], before["target"], before["log_alpha"], batch, noise[0])
    q = ref.twin_q(before["critic"], batch["observ"], batch["action"])
    error = q - y
    assert (np.abs(error) > 1).any() and (np.abs(error) < 1).any()
    expected = 0.5 * (batch["weight"] * error ** 2).mean(-1).sum()
    np.testing.assert_allclose(results["critic_loss"], expected, rtol=1e-4)
    # The TD errors the priorities are made of: the mean over the critics of |Q_i - y|.
    np.testing.assert_allclose(td_error, np.abs(error).mean(0), rtol=1e-4, atol=1e-5)


def test_actor_loss_uses_reparameterized_actions_and_the_stepped_critics(update):
    """alpha log pi(a~|s) - min_i Q_i(s, a~) with a~ from the second draw and the critics
    after their step. Catches: max over the critics; the alpha term's sign; the target
    critics in place of the online ones; a~ drawn at s'."""
    algo, before, batch, noise, results, _ = update
    action, log_prob = ref.squashed_sample(before["actor"], batch["observ"], noise[1])
    critic = ref.twin_q_weights(algo.networks.critic)
    q = ref.twin_q(critic, batch["observ"], action).min(0)
    alpha = np.exp(before["log_alpha"])
    np.testing.assert_allclose(results["actor_loss"], (alpha * log_prob - q).mean(),
                               rtol=1e-4)
    np.testing.assert_allclose(results["entropy"], -log_prob.mean(), rtol=1e-4)
    np.testing.assert_allclose(results["q"], q.mean(), rtol=1e-4)


def test_temperature_loss_aims_at_the_default_target_entropy_minus_the_action_size(update):
    """-log alpha mean(log pi(a~|s) + H), H = -|A| = -2; log alpha moves against the
    gradient -mean(log pi + H). Catches: H = +|A| or -|A| / 2; the loss's sign."""
    algo, before, batch, noise, results, _ = update
    _, log_prob = ref.squashed_sample(before["actor"], batch["observ"], noise[1])
    entropy_target = -float(ACTIONS)
    expected = -before["log_alpha"] * (log_prob + entropy_target).mean()
    np.testing.assert_allclose(results["temperature_loss"], expected, rtol=1e-4)
    gradient = -(log_prob + entropy_target).mean()
    moved = float(algo.checkpoint_state["log_temperature"].numpy()) - before["log_alpha"]
    # Adam's first step is the learning rate (`policy_lr`) against the gradient's sign.
    np.testing.assert_allclose(moved, -algo._config.policy_lr * np.sign(gradient), rtol=1e-3)


def test_target_critics_move_by_the_polyak_rate(update):
    """Q' <- 0.3 Q + 0.7 Q' with Q after its step. Catches: the rates swapped; no move."""
    algo, before, *_ = update
    online = ref.variables(algo.networks.critic)
    moved = ref.variables(algo.checkpoint_state["target_critic"])
    for value, old, new in zip(moved, before["target_variables"], online, strict=True):
        np.testing.assert_allclose(value, 0.3 * new + 0.7 * old, rtol=1e-5, atol=1e-6)
    assert not all(np.allclose(a, b) for a, b in zip(
        online, before["critic_variables"], strict=True)), "the critics stepped"

"""Prioritized replay inside SAC, TD3 and DQN (Schaul et al. 2016, arXiv:1511.05952):
the importance-sampling exponent beta annealed to 1 over the run's steps (sec. 3.4), the
priorities an update gives its sampled rows (sec. 3.3), and rows without a transition,
against NumPy on hand-built memories."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl.algorithms.dqn import DQN
from batchrl.algorithms.sac import SAC
from batchrl.algorithms.td3 import TD3
from batchrl.scripts.events import read_scalars
from tests import off_policy_numpy as ref

BATCH, CAPACITY, STORED, STEPS = 8, 16, 10, 1000
PRIORITIZED = {"alpha": 0.7, "beta": 0.4, "epsilon": 0.01}
GAMMA = 0.985  # default.yaml's discount.


def _algorithm(cls, step=0, **overrides):
    """`cls` with a prioritized memory of `STORED` hand-built transitions of unequal
    priorities and perturbed target networks."""
    discrete = cls is DQN
    batch_env = ref.mock_env(num_actions=4 if discrete else None)
    settings = dict(batch_size=BATCH, replay_capacity=CAPACITY, steps=STEPS,
                    prioritized_replay=PRIORITIZED)
    algo = ref.build(cls, batch_env, step=step, **{**settings, **overrides})
    for key, model in algo.checkpoint_state.items():
        if key.startswith("target_"):
            ref.perturb(model, 0.3, seed=len(key))
    rng = np.random.default_rng(0)
    action = (rng.integers(0, 4, STORED) if discrete
              else rng.uniform(-0.9, 0.9, (STORED, 2)))
    algo.memory.insert({
        "observ": rng.normal(size=(STORED, 3)).astype(np.float32),
        "action": action.astype(np.int32 if discrete else np.float32),
        "reward": rng.choice([-3.0, -0.3, 0.2, 2.5], STORED).astype(np.float32),
        "discount": rng.choice([0.0, GAMMA, GAMMA ** 2], STORED).astype(np.float32),
        "nextob": rng.normal(size=(STORED, 3)).astype(np.float32)})
    if algo.memory.prioritized:
        algo.memory.priorities.set(np.arange(STORED), rng.permutation(
            np.linspace(0.2, 3.0, STORED)).astype(np.float32))
    return algo


def _record_batches(monkeypatch, memory):
    """The batches `memory.sample` returns from now on, as NumPy dicts."""
    batches, sample = [], memory.sample

    def recorded(*args, **kwargs):
        batch = sample(*args, **kwargs)
        batches.append({key: value.numpy() for key, value in batch.items()})
        return batch

    monkeypatch.setattr(memory, "sample", recorded)
    return batches


def _leaves(memory):
    return memory.priorities.tree.numpy()[-(memory.priorities.tree.shape[0] // 2):]


def _beta(step):
    return PRIORITIZED["beta"] + (1 - PRIORITIZED["beta"]) * min(step / STEPS, 1.0)


def test_importance_weights_use_beta_annealed_to_one_over_the_runs_steps(monkeypatch):
    """w_i = (N P(i))^-beta / max_j w_j with beta = 0.4 + 0.6 min(step / steps, 1) at step
    0, half, all and three times `steps` (Schaul et al. 2016, sec. 3.4). Fails on the code
    before (beta stayed 0.4). Catches: no annealing; the schedule reversed (1 to beta);
    annealed over `log_every` in place of `steps`."""
    algo = _algorithm(DQN)
    batches = _record_batches(monkeypatch, algo.memory)
    for step in (0, STEPS // 2, STEPS, 3 * STEPS):
        algo._step.assign(step)
        priority = _leaves(algo.memory)[:STORED].astype(np.float64)
        algo._sampled_update()
        batch = batches[-1]
        probability = priority[batch["index"]] / priority.sum()
        weight = (STORED * probability) ** -_beta(step)
        weight /= weight.max()
        assert weight.min() < 0.95  # Unequal: another beta would give other weights.
        np.testing.assert_allclose(batch["weight"], weight, rtol=1e-5, err_msg=f"step {step}")


def test_beta_is_summarized_with_the_diagnostics(tmp_path):
    """`dqn/beta` is written at the step's value. Catches: the summary left out."""
    algo = _algorithm(DQN, step=STEPS // 4, log_every=1)
    algo._should_log.assign(True)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=STEPS // 4):
        algo._train(tf.constant(1))
    writer.flush()
    (scalar,) = read_scalars(tmp_path, "dqn/beta")
    np.testing.assert_allclose(scalar.value, _beta(STEPS // 4), rtol=1e-6)


def _td_errors(cls, algo, before, batch, noise):
    """|delta| of each sampled row in NumPy from the weights before the update: DQN's
    |Q(s, a) - y|, SAC's and TD3's mean over the two critics of |Q_i(s, a) - y|."""
    if cls is DQN:
        allowed = np.ones((BATCH, 4), bool)
        y, *_ = ref.dqn_target(before["q"], before["target"], batch, allowed, True)
        q = ref.q_network(before["q"], batch["observ"])[np.arange(BATCH), batch["action"]]
        return np.abs(q - y)
    if cls is SAC:
        y = ref.sac_target(before["actor"], before["target"], before["log_alpha"], batch,
                           noise)
    else:
        config = algo._config
        y = ref.td3_target(before["target_actor"], before["target"], batch, noise,
                           config.target_noise, config.target_noise_clip)
    return np.abs(ref.twin_q(before["critic"], batch["observ"], batch["action"]) - y).mean(0)


def _weights_before(cls, algo):
    state = algo.checkpoint_state
    if cls is DQN:
        return {"q": ref.q_network_weights(state["policy"]),
                "target": ref.q_network_weights(state["target_policy"])}
    before = {"critic": ref.twin_q_weights(state["critic"]),
              "target": ref.twin_q_weights(state["target_critic"])}
    if cls is SAC:
        return dict(before, actor=ref.gaussian_actor_weights(state["policy"]),
                    log_alpha=float(state["log_temperature"].numpy()))
    return dict(before, target_actor=ref.deterministic_actor_weights(state["target_policy"]))


@pytest.mark.parametrize("cls", [DQN, SAC, TD3], ids=["dqn", "sac", "td3"])
def test_sampled_rows_get_priorities_from_the_td_errors_before_the_update(cls, monkeypatch):
    """p_i = (|delta_i| + epsilon)^alpha for each sampled row (a repeated row keeps its
    last occurrence's), delta from the weights before the update; the other rows keep
    theirs. Catches: delta after the update; alpha left out; epsilon left out; SAC's and
    TD3's delta from Q_1 alone."""
    algo = _algorithm(cls)
    batches = _record_batches(monkeypatch, algo.memory)
    before = _weights_before(cls, algo)
    noise = ref.clone(algo._random).normal([BATCH, 2]).numpy()  # SAC's and TD3's first draw.
    old = _leaves(algo.memory).copy()
    algo._sampled_update()
    (batch,) = batches
    error = _td_errors(cls, algo, before, batch, noise)
    assert (error > 1).any() and (error < 1).any()
    expected = old.copy()
    expected[batch["index"]] = (error + PRIORITIZED["epsilon"]) ** PRIORITIZED["alpha"]
    np.testing.assert_allclose(_leaves(algo.memory), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prioritized", [PRIORITIZED, None], ids=["prioritized", "uniform"])
def test_rows_without_a_transition_never_carry_priority_nor_are_sampled(prioritized,
                                                                        monkeypatch):
    """A memory filled by `add` with 2-step windows (steps that wait in them are written
    to the spare row) and by `insert`, then 6 updates: every sampled row holds a
    transition, every row past them has priority 0. Catches: the sum tree's leaves
    starting at 1; the spare row given the new transitions' priority; uniform sampling over
    the capacity."""
    algo = _algorithm(DQN, n_step=2, prioritized_replay=prioritized)
    rng = np.random.default_rng(1)
    for terminated in ([False, False], [True, False], [False, False]):
        algo.memory.add([0, 1], rng.normal(size=(2, 3)).astype(np.float32), [1, 2],
                        [0.5, -0.5], terminated, [False, False],
                        rng.normal(size=(2, 3)).astype(np.float32))
    size = int(algo.memory.size.numpy())
    assert size == STORED + 4  # Agent 0's first two steps, agent 1's first two.
    batches = _record_batches(monkeypatch, algo.memory)
    for _ in range(6):
        algo._sampled_update()
    sampled = np.concatenate([batch["index"] for batch in batches])
    assert sampled.max() < size
    if prioritized:
        leaves = _leaves(algo.memory)
        assert (leaves[:size] > 0).all() and (leaves[size:] == 0).all()

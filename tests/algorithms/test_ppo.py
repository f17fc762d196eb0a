"""BatchPPO inside `simulate`, on MockEnvironment batches."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms import parts
from batchrl.algorithms.ppo import PPO
from batchrl.drivers.loop import step_function
from batchrl.drivers.simulate import episode_state, simulate
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.native_tasks import Pendulum
from batchrl.networks import feed_forward_gaussian, recurrent_gaussian
from tests.algorithms.ppo_memory import load_memory
from tests.optimizers import numpy_steps


def _config(**overrides):
    config = configs.load("default", {"policy_layers": [16], "value_layers": [16],
                                      "update_every": 4, "update_epochs": 3})
    config.update(network=feed_forward_gaussian, max_length=12)
    config.update(overrides)
    return config


def _setup(observ_shape, durations, truncate=False, action_shape=(2,), **overrides):
    """PPO in `simulate` over MockEnvironments of episodes of `durations` steps (`(low,
    high)` each); `truncate`: whether their episodes end truncated, for all or per
    environment."""
    tf.keras.utils.set_random_seed(0)  # The same initial weights in every run.
    truncates = truncate if isinstance(truncate, list) else [truncate] * len(durations)
    envs = [MockEnvironment(observ_shape, action_shape, low, high, truncate=cut)
            for (low, high), cut in zip(durations, truncates, strict=True)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    step = tf.Variable(0, dtype=tf.int64)
    is_training = tf.Variable(True)
    should_log = tf.Variable(False)
    algo = PPO(batch_env, step, is_training, should_log, _config(**overrides))
    episode_state(batch_env)  # Its variables exist before the trace: one trace, not two.

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    return batch_env, algo, is_training, run


@pytest.mark.parametrize("observ_shape, overrides", [
    ((1,), dict(chunk_length=4, batch_size=3)),  # Minibatches of 3 chunks of 4 steps.
    ((2, 3, 4), {}),  # Whole episodes, one full batch. (2, 3): the recurrent tests.
])
def test_trains_without_crash_on_observation_shapes(observ_shape, overrides):
    batch_env, algo, _, run = _setup(observ_shape, [(1, 12), (3, 5), (2, 9)], **overrides)
    before = [v.numpy().copy() for v in algo.networks.policy.trainable_variables]
    value_before = [v.numpy().copy() for v in algo.networks.value.trainable_variables]
    penalty = float(algo.checkpoint_state["kl_penalty"].numpy())
    episodes = 0
    for _ in range(60):
        done, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
        episodes += int(done.numpy().sum())
    assert episodes >= 8, "at least two updates of 4 episodes"
    after = algo.networks.policy.trainable_variables
    changed = [not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True)]
    assert any(changed), "the policy trained"
    value_after = algo.networks.value.trainable_variables
    assert any(not np.allclose(a, b.numpy())
               for a, b in zip(value_before, value_after, strict=True)), "the value trained"
    assert float(algo.checkpoint_state["kl_penalty"].numpy()) != penalty, "penalty adapted"
    assert int(algo.checkpoint_state["observ_filter"].count) == 60 * 3
    assert run.experimental_get_tracing_count() <= 2


def test_eval_mode_records_nothing_and_episodes_that_do_not_fit_are_dropped():
    """In eval mode the agents act with the mean and nothing is recorded; back in training,
    episodes that end when the memory has no row free for them are dropped, and with
    `reward_normalizer: reward` the rewards' scale is the std of the rewards recorded."""
    batch_env, algo, is_training, run = _setup((2,), [(2, 2)] * 3, update_every=4,
                                               reward_normalizer="reward")
    is_training.assign(False)
    observ_filter = algo.checkpoint_state["observ_filter"]
    began, checked = run(False, True)[0].numpy(), 0
    for _ in range(4):  # Calls 2 and 4 take the second step of an episode.
        observ = batch_env.observ.numpy()  # What the next step acts on, if none begins.
        done = run(False, False)[0].numpy()
        if not began.any():
            normalized = observ_filter.transform(observ)
            params, _ = algo.networks.policy(normalized[:, None], np.zeros((3, 0), np.float32))
            mean = params["mean"][:, 0].numpy()
            np.testing.assert_allclose(batch_env.action.numpy(), mean, rtol=1e-5, atol=1e-6)
            checked += 1
        began = done
    assert checked == 2
    assert int(observ_filter.count) == 0
    assert int(algo._episodes.length.numpy().sum()) == 0
    assert int(algo._memory_index.numpy()) == 0

    is_training.assign(True)
    rewards = []

    def play(reset=False):
        run(False, reset)
        episodes, length = algo._episodes.data()
        rewards.append(episodes["reward"].numpy()[np.arange(3), length.numpy() - 1])

    play(reset=True)  # Every agent begins a new episode.
    play()  # Three episodes end: memory holds 3 of 4.
    assert int(algo._memory_index.numpy()) == 3
    play()
    play()  # Three more: one fits, the update runs, the memory empties.
    assert int(algo._memory_index.numpy()) == 0
    std = float(algo.checkpoint_state["reward_filter"].std.numpy())
    assert std == pytest.approx(np.std(rewards, ddof=1), rel=1e-4)


def test_records_whether_episodes_terminated_or_were_truncated():
    """Agent 0's episodes terminate, agent 1's are truncated. The run has no normalization
    (`normalize_observ` and `normalize_reward` false): its filters leave observations and
    rewards as they are (a run with them moves both: tests/algorithms/test_learning.py)."""
    _, algo, _, run = _setup((2,), [(3, 3), (5, 5)], truncate=[False, True], update_every=50,
                             normalize_observ=False, normalize_reward=False)
    for _ in range(5):
        run(False, False)
    memory_terminated = algo._memory_terminated.numpy()
    episodes = int(algo._memory_index.numpy())
    assert episodes == 2  # Agent 0 finished at step 3 (terminated), agent 1 at step 5.
    np.testing.assert_array_equal(memory_terminated[:episodes], [True, False])
    np.testing.assert_array_equal(algo._memory.length.numpy()[:episodes], [3, 5])
    observ = np.random.default_rng(0).normal(size=(5, 2)).astype(np.float32)
    reward = np.array([-1.0, -4.0, -9.0], np.float32)
    np.testing.assert_array_equal(algo._observ_filter.transform(observ).numpy(), observ)
    np.testing.assert_array_equal(algo._reward_filter.transform(reward).numpy(), reward)


@pytest.mark.parametrize("kind, state_size", [("gru", 6), ("lstm", 12)])
def test_declared_recurrent_layer_trains_on_chunks_from_stored_states(kind, state_size):
    """A recurrent layer declared in `network` trains on chunks; at every step the agents
    that begin an episode act from a zero state, the others from the state their previous
    step left, which acting advances."""
    from batchrl import configs as configs_lib
    from batchrl import networks

    layers = configs_lib.load("default", {"network": [
        {"type": "flatten"}, {"type": "dense", "units": 8}, {"type": kind, "units": 6}]}
    ).network
    _, algo, _, run = _setup(
        (2, 3), [(3, 12), (5, 9), (2, 7)], network=networks.constructor(layers),
        chunk_length=4, batch_size=2)
    assert algo.state_size == state_size
    # The value network is feed-forward: a dense layer of 6 units in the recurrent one's place.
    assert not hasattr(algo.networks.value._hidden, "state_size")
    assert algo.networks.value._hidden.output_size == 6
    before = [v.numpy().copy() for v in algo.networks.policy.trainable_variables]
    began = np.ones(3, bool)  # The first call begins every agent's episode.
    mixed = 0  # Calls at which some agents began an episode and others did not.
    acting = algo.progress_state  # The acting half's per-agent variables among them.
    for _ in range(50):
        state = acting["state"].numpy()
        done, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
        acted_from = acting["last_state"].numpy()
        assert acted_from.shape == (3, state_size)
        np.testing.assert_array_equal(acted_from[began], 0.0)
        np.testing.assert_array_equal(acted_from[~began], state[~began])
        advanced = acting["state"].numpy()
        assert all(not np.allclose(advanced[agent], acted_from[agent]) for agent in range(3))
        assert (np.abs(advanced) > 0).any(axis=1).all()
        mixed += began.any() and not began.all()
        began = done.numpy()
    assert mixed >= 5
    after = algo.networks.policy.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))


def _fill_memory(algo, run, update_every):
    """Plays until the memory holds `update_every - 1` episodes (no update yet), then
    copies the first into the last row: a full memory that has not trained."""
    while int(algo._memory_index.numpy()) < update_every - 1:
        run(False, False)
    episodes, length = algo._memory.data([0])
    algo._memory.replace(episodes, length, [update_every - 1])


def _memory_update(algo):
    """A `tf.function(shift)` that restores the current memory, with `shift` added to the
    stored policy means, and runs one update on it; returns the update's metrics."""
    episodes, length = algo._memory.data()
    episodes = {key: value.numpy() for key, value in episodes.items()}
    length = length.numpy()
    rows = tf.range(len(length))

    @tf.function(autograph=False)
    def update(shift):
        stored = [algo._memory.replace(
            dict(episodes, policy_mean=episodes["policy_mean"] + shift), length, rows),
            algo._memory_index.assign(len(length))]
        with tf.control_dependencies(stored):
            return algo._update()

    return update


@pytest.fixture(scope="module")
def full_memory():
    """What a PPO (`update_every` 3) on three MockEnvironments of (3,) observations, whose
    episodes of 4 to 6 steps end truncated, holds once `_fill_memory` filled its memory:
    its weights, its normalizers' statistics and the memory. `_restored` loads them into
    PPOs of other configs, which so update on the same episodes without playing them (and
    tracing `simulate`) again."""
    _, algo, _, run = _setup((3,), [(4, 6)] * 3, truncate=True, update_every=3)
    _fill_memory(algo, run, 3)
    episodes, length = algo._memory.data()
    return dict(
        weights=[network.get_weights()
                 for network in (algo.networks.policy, algo.networks.value)],
        filters=[[variable.numpy() for variable in algo.checkpoint_state[key].variables]
                 for key in ("observ_filter", "reward_filter")],
        episodes={key: value.numpy() for key, value in episodes.items()},
        length=length.numpy(), final=algo._memory_final.numpy(),
        terminated=algo._memory_terminated.numpy())


def _restored(full_memory, **overrides):
    """A PPO of `update_every` 3 and `overrides` for the environments of `full_memory`,
    not played, with its weights, normalizers and full memory loaded."""
    _, algo, _, _ = _setup((3,), [(4, 6)] * 3, truncate=True, update_every=3, **overrides)
    for network, weights in zip((algo.networks.policy, algo.networks.value),
                                full_memory["weights"], strict=True):
        network.set_weights(weights)
    for key, values in zip(("observ_filter", "reward_filter"), full_memory["filters"],
                           strict=True):
        for variable, value in zip(algo.checkpoint_state[key].variables, values, strict=True):
            variable.assign(value)
    load_memory(algo, full_memory)
    return algo


SCHEDULES = {
    "linear": dict(lr_schedule="linear", kl_schedule="linear", policy_lr=4e-4,
                   value_lr=2e-3),
    "constant": {}}


@pytest.fixture(scope="module")
def scheduled(full_memory):
    """`scheduled(kind)`: `(algo, update)`, built once per kind of `SCHEDULES`: PPO
    with `kl_target` 0.04, `kl_cutoff_coef` 1 and `steps` 1,000, its memory full (that of
    `full_memory`, three episodes) and not yet trained on; `update = _memory_update(algo)`.
    Each call gives back the weights, the KL penalty and the global step of that moment,
    for each test to begin from. `linear`: both learning rates (4e-4 and 2e-3) and the KL
    target decay over the steps."""
    built = {}

    def get(kind):
        if kind not in built:
            algo = _restored(full_memory, steps=1000, kl_target=0.04, kl_cutoff_coef=1.0,
                             **SCHEDULES[kind])
            networks = (algo.networks.policy, algo.networks.value)
            weights = [network.get_weights() for network in networks]
            step = int(algo._step.numpy())

            def reset():
                for network, values in zip(networks, weights, strict=True):
                    network.set_weights(values)
                algo.checkpoint_state["kl_penalty"].assign(1.0)
                algo._step.assign(step)

            built[kind] = algo, _memory_update(algo), reset
        algo, update, reset = built[kind]
        reset()
        return algo, update

    return get


def test_kl_is_measured_from_the_configured_reference_policy(full_memory, scheduled):
    """With a vanishing learning rate the policy does not move: the KL from the policy at
    the update's start is then 0, the KL from a stale stored behaviour policy is not."""
    algo = _restored(full_memory, policy_lr=1e-12, kl_reference="update_start")
    metrics = _memory_update(algo)(tf.constant(0.5))  # The stored behaviour means are 0.5 off.
    assert float(metrics["kl"]) < 1e-6
    _, behaviour = scheduled("constant")  # kl_reference: behaviour, the default.
    assert float(behaviour(tf.constant(0.5))["kl"]) > 0.1


def test_update_compiled_with_xla_trains_as_without(full_memory):
    """`jit_update` changes how the update runs, not what it computes."""
    weights = []
    for jit in (False, True):
        algo = _restored(full_memory, jit_update=jit, update_epochs=2)
        metrics = _memory_update(algo)(tf.constant(0.0))
        assert np.isfinite(float(metrics["policy_loss"]))
        weights.append([v.numpy() for v in algo.networks.policy.trainable_variables])
    for plain, compiled in zip(*weights, strict=True):
        np.testing.assert_allclose(compiled, plain, rtol=1e-4, atol=1e-5)


def test_whole_call_compiled_with_xla_fills_the_memory_as_without():
    """`step_function(jit_compile=True)`: XLA once sliced `agent_indices[:free]` to `free`
    entries where fewer episodes ended (and compiled again for every `_memory_index`), so
    that every call updated on a half-full memory."""
    env = Pendulum(4, max_episode_steps=3, seed=0)
    algo = PPO(env, tf.Variable(0, dtype=tf.int64), tf.Variable(True), tf.Variable(False),
               _config(update_every=6, max_length=3, update_epochs=1))
    function = step_function(env, algo, steps_per_call=3, jit_compile=True)
    indices, iterations = [], []
    for call in range(4):  # Four episodes end per call; six fill the memory.
        function(tf.constant(False), tf.constant(call == 0), tf.constant(3))
        indices.append(int(algo._memory_index.numpy()))
        iterations.append(int(algo._policy_optimizer.optimizer.iterations.numpy()))
    assert indices == [4, 0, 4, 0]
    assert iterations[0] == 0 and iterations[1] > 0
    assert iterations[2] == iterations[1] and iterations[3] == 2 * iterations[1]


def test_linear_learning_rate_schedule_decays_with_the_global_step(scheduled):
    """`lr_schedule: linear`: an update at step s trains with the rates times 1 - s/steps."""
    algo, update = scheduled("linear")
    algo._step.assign(250)
    update(tf.constant(0.0))
    policy_rate = float(algo.checkpoint_state["policy_optimizer"].learning_rate.numpy())
    value_rate = float(algo.checkpoint_state["value_optimizer"].learning_rate.numpy())
    assert policy_rate == pytest.approx(3e-4) and value_rate == pytest.approx(1.5e-3)


@pytest.mark.parametrize("schedule, target", [("constant", 0.04), ("linear", 0.01)])
def test_kl_schedule_scales_the_target_of_the_penalty_and_the_cutoff(
        scheduled, schedule, target):
    """`kl_schedule: linear`: at step 750 of 1,000 the KL target is a quarter of
    `kl_target`. Stored means shifted by 0.2 standard deviations give a KL of about 0.04
    (two action dimensions): above the linear schedule's cut-off (twice 0.01) and 1.3
    times its target, so every episode is cut off and the penalty grows; inside the
    constant target's band, so neither happens."""
    algo, update = scheduled(schedule)
    algo._step.assign(750)
    result = update(tf.constant(0.2 * algo._config.init_std))
    assert float(result["kl_target"]) == pytest.approx(target)
    assert float(result["kl"]) == pytest.approx(0.04, rel=0.2)
    linear = schedule == "linear"
    assert float(result["kl_cutoff_count"]) == (3.0 if linear else 0.0)
    assert float(result["kl_penalty"]) == pytest.approx(1.5 if linear else 1.0)


@pytest.mark.parametrize("max_norm", [None, 0.01])
def test_max_gradient_norm_clips_the_global_norm_of_every_step(max_norm):
    """Each of PPO's optimizer steps (`parts.apply_gradients` with the value's and the
    policy's Adam)
    applies the gradient scaled to a global norm of at most `max_gradient_norm` (null:
    unscaled), against NumPy's Adam; the reported norm is the one before clipping. Adam's
    step does not change when all its gradients are scaled alike, so the two steps have
    norms 5 (clipped to 0.01) and 0.002 (not clipped), which clipping weighs otherwise."""
    _, algo, _, _ = _setup((3,), [(4, 4)] * 2, max_gradient_norm=max_norm)
    random = np.random.default_rng(0)
    for network, optimizer, rate in (
            (algo.networks.value, algo._value_optimizer, algo._config.value_lr),
            (algo.networks.policy, algo._policy_optimizer, algo._config.policy_lr)):
        variables = network.trainable_variables
        start = [variable.numpy() for variable in variables]
        gradients = numpy_steps.random_gradients(
            random, [value.shape for value in start], (5.0, 0.002))
        expected, norms = numpy_steps.adam_steps(start, gradients, max_norm, rate)
        for gradient, norm in zip(gradients, norms, strict=True):
            with tf.GradientTape() as tape:  # A loss whose gradient is `gradient`.
                loss = tf.add_n([tf.reduce_sum(variable * g) for g, variable in zip(
                    gradient, variables, strict=True)])
            reported = float(parts.apply_gradients(tape, loss, variables, optimizer))
            assert reported == pytest.approx(norm, rel=1e-5)
        for variable, value in zip(variables, expected, strict=True):
            np.testing.assert_allclose(variable.numpy(), value, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("normalizer", ["return"])  # `reward`: the eval mode test's run.
def test_reward_normalizer_takes_the_std_of_rewards_or_of_discounted_returns(normalizer):
    """With `return`, the scale is the std of each agent's discounted return so far, which
    restarts with every episode (episodes of 4 steps, 10 steps played). The normalized
    observations stored for training lie within [-observ_clip, observ_clip] (0.5)."""
    _, algo, _, run = _setup((2,), [(4, 4)] * 2, update_every=50, discount=0.9,
                             reward_normalizer=normalizer, observ_clip=0.5)
    rewards, observ = [], []
    for _ in range(10):
        run(False, False)
        episodes, length = algo._episodes.data()
        latest = episodes["reward"].numpy()[np.arange(2), length.numpy() - 1]
        rewards.append(latest)
        observ.append(episodes["observ"].numpy()[np.arange(2), length.numpy() - 1])
    assert np.abs(np.array(observ)).max() == pytest.approx(0.5)
    rewards = np.array(rewards)  # [steps, agents]
    expected = rewards.copy()
    if normalizer == "return":
        for t in range(1, len(rewards)):
            if t % 4:  # not the first step of an episode
                expected[t] += 0.9 * expected[t - 1]
    std = float(algo.checkpoint_state["reward_filter"].std.numpy())
    assert std == pytest.approx(np.std(expected, ddof=1), rel=1e-4)


def _numpy_lambda_returns(reward, value, bootstrap, discount, lam):
    """GAE(lambda) targets A_t + V(s_t) of one episode (arXiv:1506.02438, eq. 16), NumPy."""
    target, running = np.zeros_like(reward), 0.0
    for t in reversed(range(len(reward))):
        following = bootstrap if t == len(reward) - 1 else value[t + 1]
        running = reward[t] + discount * following - value[t] + discount * lam * running
        target[t] = running + value[t]
    return target


@pytest.mark.parametrize("normalize", [False, True])
def test_normalize_value_fits_returns_standardized_by_their_running_statistics(
        full_memory, normalize):
    """`normalize_value`: the network's output is mapped back to returns with the running
    statistics as they are when the update begins (here those of 50 earlier returns of mean
    40 and std 7), for the values and for the bootstraps of the truncated episodes, before
    GAE; the update adds its lambda-returns to the statistics, and the value network fits
    them standardized by the updated statistics (else as they are). A vanishing value
    learning rate keeps the network fixed, so that the one full-batch value loss can be
    recomputed in NumPy. The memory is `full_memory`'s: truncated episodes of 4 to 6 steps."""
    algo = _restored(full_memory, update_epochs=1, value_lr=1e-12, normalize_value=normalize)
    prior = np.random.default_rng(0).normal(40.0, 7.0, 50)
    if normalize:
        statistics = algo.checkpoint_state["value_filter"]
        statistics.reset()
        statistics.update(prior)
    mean, std = (prior.mean(), prior.std(ddof=1)) if normalize else (0.0, 1.0)
    config = algo._config
    episodes, length = algo._memory.data()
    observ, length = episodes["observ"].numpy(), length.numpy()
    raw = algo.networks.value(observ).numpy()
    raw_final = algo.networks.value(algo._memory_final.numpy()[:, None])[:, 0].numpy()
    assert not algo._memory_terminated.numpy().any()
    reward_std = float(algo.checkpoint_state["reward_filter"].std.numpy())
    reward = np.clip(episodes["reward"].numpy() / (reward_std + 1e-8), -10.0, 10.0)
    value = raw * (std + 1e-8) + mean  # What the network's output stands for.
    final = raw_final * (std + 1e-8) + mean
    targets = [_numpy_lambda_returns(reward[e, :n], value[e, :n], final[e], config.discount,
                                     config.gae_lambda) for e, n in enumerate(length)]
    valid = np.concatenate(targets)
    if normalize:
        seen = np.concatenate([prior, valid])
        mean, std = seen.mean(), seen.std(ddof=1)
    fitted = [(target - mean) / (std + 1e-8) for target in targets]
    errors = np.concatenate([raw[e, :n] - fitted[e] for e, n in enumerate(length)])
    expected = 0.5 * np.mean(np.square(errors))

    metrics = _memory_update(algo)(tf.constant(0.0))
    assert float(metrics["value_loss"]) == pytest.approx(expected, rel=1e-4)
    assert float(metrics["mean_return"]) == pytest.approx(valid.mean(), rel=1e-4)
    returned = algo._value(observ).numpy()
    if normalize:
        statistics = algo.checkpoint_state["value_filter"]
        assert float(statistics.mean) == pytest.approx(mean, rel=1e-5)
        assert float(statistics.std) == pytest.approx(std, rel=1e-5)
        np.testing.assert_allclose(returned, raw * std + mean, rtol=1e-4, atol=1e-4)
    else:
        assert "value_filter" not in algo.checkpoint_state
        np.testing.assert_allclose(returned, raw, rtol=1e-5, atol=1e-6)


def test_linear_kl_schedule_holds_a_tenth_of_the_target_from_90_percent_of_steps():
    """`kl_schedule: linear` decays `kl_target` with the fraction of `steps` still to train,
    down to `kl_target_floor` (0.1) of it, held from then on, also past `steps` (a resumed
    run, an Agent): the target never reaches 0."""
    _, algo, _, _ = _setup((3,), [(4, 4)], steps=1000, kl_target=0.04,
                           kl_schedule="linear")
    for step in (0, 500, 900, 950, 1000, 1500, 10_000):
        algo._step.assign(step)
        expected = 0.04 * max(1.0 - step / 1000, 0.1)
        assert float(algo._kl_target()) == pytest.approx(expected, rel=1e-6), step
        assert float(algo._kl_target()) >= 0.004 * (1 - 1e-6), step


def test_kl_penalty_falls_past_the_end_of_a_linear_kl_schedule(scheduled):
    """At and past `steps`, a KL of 0.002 (stored means 0.045 standard deviations off, two
    action dimensions, a policy that does not move: the learning rates are 0 there) is
    below 0.7 times the held target (0.004): the penalty falls by 1.5 at every update. A
    target of 0 would make every KL too large: the penalty would grow by 1.5 at every update
    (1.5^8 = 26 after eight)."""
    algo, update = scheduled("linear")
    shift = tf.constant(np.sqrt(0.002) * algo._config.init_std, tf.float32)
    penalties, targets = [], []
    for step in (1000, 1000, 1000, 1000, 2000, 2000, 2000, 2000):
        algo._step.assign(step)
        metrics = update(shift)
        assert float(metrics["kl"]) == pytest.approx(0.002, rel=0.05)
        penalties.append(float(metrics["kl_penalty"]))
        targets.append(float(metrics["kl_target"]))
    np.testing.assert_allclose(penalties, 1.5 ** -np.arange(1.0, 9.0), rtol=1e-5)
    np.testing.assert_allclose(targets, 0.004, rtol=1e-6)


def test_update_start_reference_replays_recurrent_chunks_from_the_stored_states():
    """`kl_reference: update_start` with a recurrent policy trained on chunks: the reference
    is the policy at the update's start replayed as the policy steps replay it, each chunk
    from the state stored at its first step, so that before any gradient step the KL
    between the two is 0. The weights are changed after the memory was filled (an update
    in the middle of its episodes), so that the stored states are not those a replay from
    the episode's start gives. With the KL penalty 1, no cut-off and one full-batch step,
    the logged policy loss minus the surrogate is the mean KL of that step."""
    _, algo, _, run = _setup(
        (3,), [(6, 9), (5, 8), (7, 9)], network=recurrent_gaussian, policy_layers=[8, 6],
        update_every=3, update_epochs=1, chunk_length=2, max_length=10, policy_lr=1e-12,
        kl_reference="update_start", kl_init_penalty=1.0, kl_cutoff_coef=0.0)
    _fill_memory(algo, run, 3)
    noise = np.random.default_rng(1)
    for variable in algo.networks.policy.trainable_variables:
        variable.assign_add(0.3 * noise.normal(size=variable.shape).astype(np.float32))
    # The setup shows a difference: replayed from the episodes' start, the chunks that
    # begin inside an episode see other states than the stored ones.
    episodes, length = algo._memory.data()
    observ, state = episodes["observ"].numpy(), episodes["state"].numpy()
    whole = algo.networks.distribution(algo.networks.policy(observ, state[:, 0])[0])
    chunks = algo.networks.policy(observ.reshape(-1, 2, 3), state.reshape(-1, 2, 6)[:, 0])[0]
    chunked = algo.networks.distribution(
        {key: tf.reshape(value, whole.mean.shape) for key, value in chunks.items()})
    mask = advantage_lib.sequence_mask(length, 10)
    assert float(advantage_lib.masked_mean(whole.kl(chunked), mask)) > 1e-3

    metrics = _memory_update(algo)(tf.constant(0.0))
    assert abs(float(metrics["policy_loss"]) - float(metrics["surrogate"])) < 1e-6
    assert float(metrics["kl"]) < 1e-6

"""SAC, TD3 and DQN: their formulas against NumPy, and the algorithms inside `simulate`
on MockEnvironment batches and in-graph Pendulum."""

import math

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.algorithms import dqn, off_policy
from batchrl.algorithms.dqn import DQN
from batchrl.algorithms.sac import SAC
from batchrl.algorithms.td3 import TD3
from batchrl.drivers.loop import step_function
from batchrl.drivers.simulate import episode_state, simulate
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.native_tasks import Pendulum
from batchrl.networks import q_networks
from batchrl.scripts.events import read_scalars
from tests.optimizers import numpy_steps

SMALL = {"policy_layers": [16], "value_layers": [16], "learning_starts": 8,
         "batch_size": 8, "replay_capacity": 64}


def _config(algorithm, **overrides):
    return configs.load("default", {"algorithm": algorithm, **SMALL, **overrides})


def _run(batch_env, algo):
    episode_state(batch_env)  # Its variables exist before the trace: one trace, not two.

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)
    return run


def _mock(observ_shape, count=3):
    envs = [MockEnvironment(observ_shape, (2,), 2, 7) for _ in range(count)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    return InGraphBatchEnv(BatchEnv(envs, blocking=True))


def _build(cls, batch_env, **overrides):
    return cls(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
               tf.Variable(False), _config(cls.name, **overrides))


def test_squashed_log_prob_matches_the_change_of_variables():
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(64, 3)).astype(np.float32)
    log_std = rng.uniform(-1.5, 0.5, size=(64, 3)).astype(np.float32)
    noise = rng.normal(size=(64, 3)).astype(np.float32)
    action, log_prob = q_networks.squashed_sample(mean, log_std, noise)
    u = mean + np.exp(log_std) * noise
    gaussian = (-0.5 * ((u - mean) / np.exp(log_std)) ** 2 - log_std
                - 0.5 * np.log(2 * np.pi))
    expected = (gaussian - np.log(1 - np.tanh(u) ** 2)).sum(-1)
    np.testing.assert_allclose(action.numpy(), np.tanh(u), rtol=1e-6)
    np.testing.assert_allclose(log_prob.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_squashed_density_integrates_to_one_and_stays_finite_at_the_bounds():
    grid = np.linspace(-1 + 1e-6, 1 - 1e-6, 200001)
    u = np.arctanh(grid)
    mean, log_std = 0.7, -0.3
    noise = ((u - mean) / math.exp(log_std)).astype(np.float32)[:, None]
    _, log_prob = q_networks.squashed_sample(
        np.full_like(noise, mean), np.full_like(noise, log_std), noise)
    assert abs(np.trapezoid(np.exp(log_prob.numpy()), grid) - 1.0) < 1e-3
    _, extreme = q_networks.squashed_sample(
        np.zeros((1, 1), np.float32), np.full((1, 1), 2.0, np.float32),
        np.full((1, 1), 30.0, np.float32))  # tanh(u) rounds to 1.
    assert np.isfinite(extreme.numpy()).all()


@pytest.mark.parametrize("rate", [0.005, 0.5, 1.0])
def test_polyak_moves_targets_by_the_rate(rate):
    online = [tf.Variable(np.arange(6.0).reshape(2, 3)), tf.Variable([1.0, -2.0])]
    target = [tf.Variable(np.ones((2, 3))), tf.Variable([0.0, 0.0])]
    expected = [rate * o.numpy() + (1 - rate) * t.numpy()
                for t, o in zip(target, online, strict=True)]
    off_policy.polyak(target, online, rate)
    for variable, value in zip(target, expected, strict=True):
        np.testing.assert_allclose(variable.numpy(), value)


@pytest.mark.parametrize("double", [True, False])
def test_double_q_target_against_numpy(double):
    rng = np.random.default_rng(1)
    reward = rng.normal(size=5).astype(np.float32)
    discount = np.array([0.99, 0.0, 0.99 ** 3, 0.99, 0.5], np.float32)
    online, target = rng.normal(size=(2, 5, 4)).astype(np.float32)
    value = (target[np.arange(5), online.argmax(-1)] if double else target.max(-1))
    result = dqn.double_q_target(reward, discount, online, target, double)
    np.testing.assert_allclose(result.numpy(), reward + discount * value, rtol=1e-6)


def test_twin_q_heads_are_independent_networks():
    q = q_networks.TwinQ([8, 8])
    observ = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    action = np.random.default_rng(3).uniform(-1, 1, size=(5, 2)).astype(np.float32)
    values = q(observ, action).numpy()
    assert values.shape == (2, 5)
    assert not np.allclose(values[0], values[1])
    weights = q.trainable_variables  # Kernels [2, in, out] and biases [2, 1, out].
    h = np.concatenate([observ, action], -1)  # NumPy forward pass of head 1 alone.
    for layer in range(3):
        kernel, bias = weights[2 * layer].numpy()[1], weights[2 * layer + 1].numpy()[1, 0]
        h = h @ kernel + bias
        if layer < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(values[1], h[:, 0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls, observ_shape", [(TD3, (2, 3, 4))])
def test_continuous_algorithms_train_without_crash_on_observation_shapes(cls, observ_shape):
    # SAC and TD3 flatten observations with the same code (`q_networks`), which SAC's
    # learning test runs on Pendulum's (3,) (tests/algorithms/test_off_policy_learning.py);
    # the whole replay ratio here counts the updates of `OffPolicyAlgorithm`, which both
    # share (SAC's fractional one: the `sac_on_mock` fixture).
    batch_env = _mock(observ_shape)
    algo = _build(cls, batch_env)
    run = _run(batch_env, algo)
    before = [v.numpy().copy() for v in algo.networks.policy.trainable_variables]
    for _ in range(20):
        _, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
    # 60 transitions, updates from the 8th on: one per agent step.
    assert int(algo.memory.size.numpy()) == 60
    assert int(algo.updates.numpy()) == 60 - 6
    after = algo.networks.policy.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))


@pytest.fixture(scope="module")
def sac_on_mock(tmp_path_factory):
    """SAC with declared convolutions of its own (`_conv_built`: frames of (9, 9, 3)
    stored as bytes) on three MockEnvironments, updating from the first transition at
    0.4 updates per agent step, with a target entropy far above the policy's and a fast
    temperature: what 10 training calls did (`convolutions`: `_conv_kernels` before and
    after them; `summaries`: the directory its summaries went to, `log_every` 6, the step
    counted up by the 3 agents' steps after each call), then what eval mode does (the greedy
    action and the one performed for the same observations; 5 more calls)."""
    built = _conv_built("sac", updates_per_step=0.4, learning_starts=0, target_entropy=50.0,
                        policy_lr=0.01, log_every=6)
    batch_env, algo = built.batch_env, built.algo
    run = _run(batch_env, algo)
    result = {"policy_before": [v.numpy().copy() for v in algo.networks.policy.variables],
              "convolutions": _conv_kernels(algo),
              "summaries": tmp_path_factory.mktemp("sac_summaries")}
    writer = tf.summary.create_file_writer(str(result["summaries"]))
    with writer.as_default(step=built.step):
        for _ in range(10):
            _, score = run(False, False)
            assert np.isfinite(score.numpy()).all()
            built.step.assign_add(3)
    writer.close()
    result["convolutions"]["after"] = _conv_kernels(algo)["before"]
    result.update(
        updates=int(algo.updates.numpy()), size=int(algo.memory.size.numpy()),
        update_debt=float(algo.checkpoint_state["update_debt"].numpy()),
        temperature=float(tf.exp(algo.checkpoint_state["log_temperature"]).numpy()),
        policy_after=[v.numpy().copy() for v in algo.networks.policy.variables])
    algo._is_training.assign(False)
    observ = tf.constant(batch_env.observ.numpy())
    result["greedy"] = algo.policy_action(observ, tf.zeros([3, 0]))[0].numpy()
    result["performed"] = algo.perform(tf.range(3), observ).numpy()
    for _ in range(5):
        run(False, False)
    result["eval_size"] = int(algo.memory.size.numpy())
    result["eval_updates"] = int(algo.updates.numpy())
    return result


def test_fractional_replay_ratio_carries_its_remainder(sac_on_mock):
    assert sac_on_mock["size"] == 30
    assert sac_on_mock["updates"] == 12  # floor(30 * 0.4)
    np.testing.assert_allclose(sac_on_mock["update_debt"], 0.0, atol=1e-5)
    assert any(not np.allclose(a, b) for a, b in zip(
        sac_on_mock["policy_before"], sac_on_mock["policy_after"], strict=True))


def test_update_summaries_are_written_at_most_once_per_log_every_steps(sac_on_mock):
    """While `should_log`, an update writes its summaries (under `sac/`) when `log_every`
    (6) or more steps passed since the last write: the fixture's calls at steps 0, 3, ...,
    27 each run 1 or 2 updates (0.4 per step of 3 agents), so the writes fall at the steps
    this rule picks."""
    expected, last = [], None
    for call, step in enumerate(range(0, 30, 3)):
        updates = math.floor(0.4 * 3 * (call + 1)) - math.floor(0.4 * 3 * call)
        if updates and (last is None or step >= last + 6):
            expected.append(step)
            last = step
    for tag in ("sac/critic_loss", "sac/replay_size"):
        steps = [scalar.step for scalar in read_scalars(sac_on_mock["summaries"], tag)]
        assert steps == expected, tag


def test_eval_mode_acts_greedily_and_stores_nothing(sac_on_mock):
    np.testing.assert_allclose(sac_on_mock["performed"], sac_on_mock["greedy"])
    assert (sac_on_mock["eval_size"], sac_on_mock["eval_updates"]) == (
        sac_on_mock["size"], sac_on_mock["updates"])


def test_sac_learns_the_temperature_towards_the_target_entropy(sac_on_mock):
    """With a target entropy far above the policy's, the temperature rises."""
    assert sac_on_mock["temperature"] > 1.0


def test_dqn_trains_on_cartpole_without_crash():
    batch_env = _cartpole()
    algo = _build(DQN, batch_env, updates_per_step=0.25, dueling=True,
                  target_update_rate=1.0, target_update_every=2)
    run = _run(batch_env, algo)
    for _ in range(40):
        done, _ = run(False, False)
    assert int(algo.memory.size.numpy()) == 64  # 80 transitions in a memory of 64.
    assert int(algo.updates.numpy()) == (80 - 8) // 4
    q = algo.networks.policy
    target = algo.checkpoint_state["target_policy"]
    # Every second update ends with a copy, the 18th among them.
    assert int(algo.updates.numpy()) % 2 == 0
    for t, o in zip(target.variables, q.variables, strict=True):
        np.testing.assert_allclose(t.numpy(), o.numpy())


@pytest.mark.parametrize("cls", [SAC, TD3, DQN])
def test_every_gradient_step_is_clipped_to_max_gradient_norm(cls):
    """The Adam of each of SAC's, TD3's and DQN's losses (`policy_lr` or `value_lr`) scales
    the gradient to a global norm of at most `max_gradient_norm` (0.01), except SAC's
    temperature's (never clipped), against NumPy's Adam; the reported norm is the one
    before clipping. Adam's step does not change when all its gradients are scaled alike,
    so the two steps have norms 5 (clipped) and 0.002 (not), which clipping weighs
    otherwise."""
    algo = _build(cls, _cartpole() if cls is DQN else _mock((3,)), max_gradient_norm=0.01)
    config = algo._config
    if cls is DQN:
        steps = [(algo._optimizer, algo._q.trainable_variables, config.value_lr, 0.01)]
    else:
        steps = [
            (algo._critic_optimizer, algo._critic.trainable_variables, config.value_lr, 0.01),
            (algo._actor_optimizer, algo._actor.trainable_variables, config.policy_lr, 0.01)]
    if cls is SAC:
        steps.append((algo._alpha_optimizer, [algo._log_alpha], config.policy_lr, None))
    random = np.random.default_rng(0)
    for optimizer, variables, rate, max_norm in steps:
        start = [variable.numpy() for variable in variables]
        gradients = numpy_steps.random_gradients(
            random, [value.shape for value in start], (5.0, 0.002))
        expected, norms = numpy_steps.adam_steps(start, gradients, max_norm, rate)
        for gradient, norm in zip(gradients, norms, strict=True):
            diagnostics = optimizer.apply([tf.constant(g) for g in gradient], variables)
            assert float(diagnostics["gradient_norm"]) == pytest.approx(norm, rel=1e-5)
        for variable, value in zip(variables, expected, strict=True):
            np.testing.assert_allclose(variable.numpy(), value, rtol=1e-5, atol=1e-8)


def _cartpole(count=2):
    envs = [gym.make("CartPole-v1") for _ in range(count)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    return InGraphBatchEnv(BatchEnv(envs, blocking=True))


def test_update_compiled_with_xla_trains_as_without(tmp_path):
    """`jit_update` changes how the update runs, not what it computes: DQN's update (whose
    only random draw, the batch's indices, XLA draws as TensorFlow does; its normal draws
    differ, so SAC's and TD3's updates cannot be compared this way) gives the same loss
    and the same step. Adam's first step moves each weight by about the learning rate
    whatever the gradient's size, so a gradient near 0 that rounds to the other sign
    moves its weight the other way: a few weights may differ by twice the rate. The
    compiled one is not played: it starts from the plain one's played state (weights,
    replay memory, random generator) through a checkpoint."""
    tf.keras.utils.set_random_seed(5)
    batch_envs = [_cartpole(), _cartpole()]
    algos = [_build(DQN, batch_env, jit_update=jit, learning_starts=1000, value_lr=0.001)
             for batch_env, jit in zip(batch_envs, (False, True), strict=True)]
    run = _run(batch_envs[0], algos[0])
    for _ in range(6):
        run(False, False)

    def state(algo):
        return tf.train.Checkpoint(**algo.checkpoint_state, **algo.progress_state)

    state(algos[1]).read(state(algos[0]).write(str(tmp_path / "played"))).expect_partial()
    assert int(algos[1].memory.size.numpy()) == int(algos[0].memory.size.numpy()) == 12
    results = []
    for algo in algos:
        initial = np.concatenate([v.numpy().ravel() for v in algo.networks.policy.variables])
        diagnostics = algo._update(tf.constant(2))
        weights = np.concatenate([v.numpy().ravel() for v in algo.networks.policy.variables])
        results.append(({k: float(v) for k, v in diagnostics.items()}, initial, weights))
    (plain, initial, plain_weights), (compiled, loaded, compiled_weights) = results
    np.testing.assert_array_equal(loaded, initial)
    for key in ("loss", "q"):
        np.testing.assert_allclose(compiled[key], plain[key], rtol=1e-4, err_msg=key)
    difference = np.abs(compiled_weights - plain_weights)
    assert (difference < 1e-5).mean() > 0.95 and difference.max() < 4.5e-3
    assert np.abs(plain_weights - initial).max() > 1e-4, "it trained"


def test_whole_call_compiles_with_xla_on_in_graph_pendulum():
    """TD3's whole training call (acting, storing, its delayed updates) in one XLA program
    stores and updates as counted. SAC's whole call is compiled by its learning test
    (tests/algorithms/test_off_policy_learning.py, `jit_step`)."""
    env = Pendulum(4, max_episode_steps=20, seed=0)
    algo = TD3(env, tf.Variable(0, dtype=tf.int64), tf.Variable(True), tf.Variable(False),
               _config("td3", learning_starts=16))
    function = step_function(env, algo, steps_per_call=10, jit_compile=True)
    function(tf.constant(False), tf.constant(True), tf.constant(10))
    function(tf.constant(False), tf.constant(False), tf.constant(10))
    assert int(algo.memory.size.numpy()) == 64
    # 80 transitions; from the 4th batch step on (16 stored) one update per transition.
    assert int(algo.updates.numpy()) == 80 - 12


def test_configuration_errors_name_the_key():
    batch_env = _mock((3,))
    with pytest.raises(ValueError, match="exploration type 'epsilon_decay' does not fit"):
        _build(TD3, batch_env, exploration={"type": "epsilon_decay"})
    with pytest.raises(ValueError, match="dqn needs a Discrete action space"):
        _build(DQN, batch_env)


CONV = [{"type": "conv2d", "filters": 4, "kernel": 3, "stride": 2}, {"type": "flatten"},
        {"type": "dense", "units": 16}]


@pytest.mark.parametrize("frame_stack", [None, {"frames": 3, "axis": -1, "window": 64}])
def test_dqn_trains_declared_convolutions_on_frames_stored_as_bytes(frame_stack):
    from batchrl import build

    envs = [MockEnvironment((9, 9, 3), (), 2, 7, observ_dtype=np.uint8, num_actions=3)
            for _ in range(3)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    config = _config("dqn", network=CONV, preprocessing=[{"type": "scale"}],
                     normalize_observ=False, max_length=20, replay_frame_stack=frame_stack)
    built = build.build(config, BatchEnv(envs, blocking=True), process_eager=False)
    algo = built.algo
    # The frames, a byte an element; with frame_stack each of the 3 channels a frame.
    stored = algo.memory.storage["frames" if frame_stack else "observ"]
    assert stored.dtype == tf.uint8 and stored.shape[1:] == (9, 9, 1 if frame_stack else 3)
    q, target = algo.networks.policy, algo.checkpoint_state["target_policy"]
    kernel = next(v for v in q.trainable_variables if len(v.shape) == 4)  # The conv's.
    before = kernel.numpy().copy()
    assert not {id(v) for v in q.variables} & {id(v) for v in target.variables}
    run = _run(built.batch_env, algo)
    for _ in range(8):
        _, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
    assert int(algo.updates.numpy()) == 24 - 6  # From the 8th transition on.
    assert not np.allclose(before, kernel.numpy())


def _conv_built(algorithm, **overrides):
    """`build.build` of `algorithm` with `CONV` (and `value_layers` [8]) for its actor and
    each critic, on three MockEnvironments of (9, 9, 3) uint8 frames and (2,) actions."""
    from batchrl import build

    envs = [MockEnvironment((9, 9, 3), (2,), 2, 7, observ_dtype=np.uint8) for _ in range(3)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    config = _config(algorithm, network=CONV, preprocessing=[{"type": "scale"}],
                     normalize_observ=False, max_length=20, value_layers=[8], **overrides)
    return build.build(config, BatchEnv(envs, blocking=True), process_eager=False)


def _conv_kernels(algo):
    """The stored observations' dtype, the id of each convolution kernel (`ids`) and its
    value (`before`), by model: `policy`, `critic`, `target_policy`, `target_critic`."""
    models = {key: value for key, value in algo.checkpoint_state.items()
              if key in ("policy", "critic", "target_policy", "target_critic")}
    kernels = {key: [v for v in model.variables if len(v.shape) == 4]
               for key, model in models.items()}
    return {"dtype": algo.memory.storage["observ"].dtype,
            "ids": {key: [id(v) for v in group] for key, group in kernels.items()},
            "before": {key: [v.numpy().copy() for v in group] for key, group in kernels.items()}}


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_sac_and_td3_train_declared_convolutions_of_their_own(sac_on_mock, algorithm):
    """SAC's: the `sac_on_mock` fixture's run (10 calls); TD3's 8 calls."""
    if algorithm == "sac":
        convolutions = sac_on_mock["convolutions"]
    else:
        built = _conv_built(algorithm)
        convolutions = _conv_kernels(built.algo)
        run = _run(built.batch_env, built.algo)
        for _ in range(8):
            _, score = run(False, False)
            assert np.isfinite(score.numpy()).all()
        convolutions["after"] = _conv_kernels(built.algo)["before"]
    assert convolutions["dtype"] == tf.uint8
    ids = convolutions["ids"]
    assert len(ids["policy"]) == 1 and len(ids["critic"]) == 2  # A torso per Q.
    every = [kernel for group in ids.values() for kernel in group]
    assert len(every) == len(set(every)), "no torso is shared"
    before, after = convolutions["before"], convolutions["after"]
    for key in ("policy", "critic"):  # Both Q functions' convolutions learn.
        assert all(not np.allclose(a, b)
                   for a, b in zip(before[key], after[key], strict=True)), key


def test_off_policy_networks_refuse_a_recurrent_layer():
    """The config refuses it (`configs.load`); a config made otherwise, when built."""
    from batchrl import build

    with pytest.raises(configs.ConfigError, match="takes feed-forward layers"):
        _config("dqn", env="CartPole-v1", network=[{"type": "gru", "units": 8}])
    config = configs.Config(_config("dqn", env="CartPole-v1"),
                            network=[{"type": "gru", "units": 8}])
    with pytest.raises(configs.ConfigError, match="take feed-forward layers"):
        build.build(config, _cartpole(), process_eager=False)

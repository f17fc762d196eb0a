import importlib
import math
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build as build_lib
from batchrl import configs, environments
from batchrl.drivers.simulate import simulate
from batchrl.native_tasks import CartPole, Pendulum
from batchrl.tools.mock_algorithm import MockAlgorithm

THETA_THRESHOLD = 12 * 2 * math.pi / 360


def _stepper(env, mode):
    """`step(action) -> (done, observ, reward, terminated)` as NumPy, run eagerly or in a
    `tf.function` (with XLA for mode "jit")."""
    def step(action):
        done = env.simulate(action)
        with tf.control_dependencies([done]):
            return (tf.identity(done), env.observ.read_value(), env.reward.read_value(),
                    env.terminated.read_value())
    if mode != "eager":
        step = tf.function(step, jit_compile=(mode == "jit"))
    return lambda action: [x.numpy() for x in step(tf.constant(action))]


def _begin(native, gym_envs, indices, rng):
    """Resets the Gymnasium environments at `indices` and copies their states into
    `native`; checks that the observations agree."""
    native.reset(indices)
    observs, states = [], []
    for index in indices:
        observ, _ = gym_envs[index].reset(seed=int(rng.integers(2**31)))
        observs.append(observ)
        states.append(gym_envs[index].unwrapped.state)
    native_observ = native.set_state(indices, np.array(states)).numpy()
    np.testing.assert_allclose(native_observ, np.array(observs), atol=1e-6)
    np.testing.assert_array_equal(native.state.numpy()[indices], np.array(states))
    assert not native.done.numpy()[indices].any()


def _follow(native, actions, mode, initial_states=None, seed=0):
    """Steps `native` and one `environments.create` environment per agent with the same
    actions, beginning new episodes where they end; checks that observations, rewards and
    flags agree within 1e-5. Returns the list of `(step, index, terminated, truncated,
    final_state)` of the episodes that ended."""
    rng = np.random.default_rng(seed)
    count = len(native)
    gym_envs = [environments.create(native.gymnasium_id) for _ in range(count)]
    _begin(native, gym_envs, list(range(count)), rng)
    if initial_states is not None:
        for env, state in zip(gym_envs, initial_states, strict=True):
            env.unwrapped.state = np.array(state, np.float64)
        native.set_state(list(range(count)), np.array(initial_states))
    step = _stepper(native, mode)
    ended = []
    for time, action in enumerate(actions):
        done, observ, reward, terminated = step(action)
        for index, env in enumerate(gym_envs):
            gym_observ, gym_reward, gym_terminated, gym_truncated, _ = env.step(action[index])
            np.testing.assert_allclose(observ[index], gym_observ, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(reward[index], gym_reward, rtol=1e-5, atol=1e-5)
            assert terminated[index] == gym_terminated, (time, index)
            assert done[index] == (gym_terminated or gym_truncated), (time, index)
            if done[index]:
                ended.append((time, index, gym_terminated, gym_truncated,
                              env.unwrapped.state.copy()))
        restart = [int(i) for i in np.flatnonzero(done)]
        if restart:
            _begin(native, gym_envs, restart, rng)
    for env in gym_envs:
        env.close()
    return ended


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_pendulum_follows_gymnasium(mode):
    native = Pendulum(3, seed=1)
    rng = np.random.default_rng(2)
    # Beyond [-1, 1] too, to check the clipping; a few steps of the next episodes.
    actions = rng.uniform(-1.3, 1.3, size=(205, 3, 1)).astype(np.float32)
    ended = _follow(native, actions, mode)
    # Every episode is truncated at the registered limit of 200 steps, never terminated.
    assert [(time, index) for time, index, *_ in ended] == [(199, 0), (199, 1), (199, 2)]
    assert all(truncated and not terminated for _, _, terminated, truncated, _ in ended)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_cartpole_follows_gymnasium_with_random_actions(mode):
    native = CartPole(4, seed=3)
    actions = np.random.default_rng(4).integers(0, 2, size=(100, 4)).astype(np.int32)
    ended = _follow(native, actions, mode)
    assert len(ended) >= 8
    assert all(terminated and not truncated for _, _, terminated, truncated, _ in ended)


def test_cartpole_follows_gymnasium_to_both_terminations():
    # Constant pushes make the pole fall; a cart started near the edge and pushed outwards
    # leaves the track first.
    initial_states = [[0.0, 0.0, 0.0, 0.0], [0.01, 0.0, 0.02, 0.0],
                      [2.3, 1.0, 0.0, 0.0], [-2.3, -1.0, 0.0, 0.0]]
    actions = np.tile(np.array([[1, 0, 1, 0]], np.int32), (40, 1))
    ended = _follow(CartPole(4, seed=5), actions, "jit", initial_states=initial_states)
    first = {}
    for _, index, terminated, _, state in ended:
        assert terminated
        first.setdefault(index, state)
    assert sorted(first) == [0, 1, 2, 3]
    for index in (0, 1):  # The pole fell, the cart stayed on the track.
        assert abs(first[index][2]) > THETA_THRESHOLD and abs(first[index][0]) <= 2.4
    for index in (2, 3):  # The cart left the track, the pole still up.
        assert abs(first[index][0]) > 2.4 and abs(first[index][2]) <= THETA_THRESHOLD


@pytest.mark.parametrize("env_class", [Pendulum, CartPole])
def test_spaces_equal_those_of_create(env_class):
    env = env_class(2)
    gym_env = environments.create(env_class.gymnasium_id)
    assert env.observation_space == gym_env.observation_space
    assert env.action_space == gym_env.action_space
    assert env.observation_space is not env_class(2).observation_space  # Not shared.
    gym_env.close()


@pytest.mark.parametrize("env_class", [Pendulum, CartPole])
def test_interface(env_class):
    env = env_class(5, max_episode_steps=7)
    assert len(env) == 5 and env.max_episode_steps == 7
    assert env.error is None
    env.close()
    assert env.done.numpy().all(), "all agents start done, so the first simulate resets them"
    assert not env.terminated.numpy().any()
    assert env.observ.shape == (5,) + env.observation_space.shape
    assert env.observ.dtype == tf.float32 and env.reward.dtype == tf.float32
    assert env.state.dtype == tf.float64 and env.state.shape == (5, env.state_size)
    assert all(not v.trainable for v in (env.observ, env.action, env.reward, env.done,
                                         env.terminated, env.state, env.elapsed_steps))
    if env_class is Pendulum:
        assert env.action.shape == (5, 1) and env.action.dtype == tf.float32
        bad_action = tf.zeros([5])
    else:
        assert env.action.shape == (5,) and env.action.dtype == tf.int32
        bad_action = tf.zeros([5, 1], tf.int32)
    with pytest.raises(ValueError, match="shape"):
        env.simulate(bad_action)
    with pytest.raises(ValueError, match="positive"):
        env_class(0)
    with pytest.raises(ValueError, match="positive"):
        env_class(1, max_episode_steps=0)


@pytest.mark.parametrize("env_class", [Pendulum, CartPole])
def test_time_limit(env_class):
    env = env_class(3, max_episode_steps=5)
    env.reset()
    env.set_state([0, 1, 2], np.zeros([3, env.state_size]))  # Balanced: no termination.
    step = tf.function(env.simulate)
    for time in range(1, 8):
        if env_class is Pendulum:
            action = tf.zeros([3, 1])
        else:
            action = tf.fill([3], time % 2)
        done = step(action).numpy()
        assert not env.terminated.numpy().any()
        np.testing.assert_array_equal(env.elapsed_steps.numpy(), [time] * 3)
        assert done.all() == (time >= 5) and done.any() == (time >= 5), time
        np.testing.assert_array_equal(env.done.numpy(), done)


@pytest.mark.parametrize("env_class", [Pendulum, CartPole])
def test_reset_subset_changes_only_those(env_class):
    env = env_class(6, seed=7)
    observ = env.reset().numpy()
    assert not env.done.numpy().any()
    np.testing.assert_array_equal(env.observ.numpy(), observ)
    action = tf.ones([6, 1]) if env_class is Pendulum else tf.ones([6], tf.int32)
    for _ in range(3):
        env.simulate(action)
    before = {name: getattr(env, name).numpy()
              for name in ("observ", "state", "reward", "elapsed_steps", "done")}
    indices = [1, 4, 4]  # A duplicate resets once.
    reset_observ = tf.function(env.reset, jit_compile=True)(tf.constant(indices)).numpy()
    assert reset_observ.shape == (3,) + env.observation_space.shape
    np.testing.assert_array_equal(env.observ.numpy()[indices], reset_observ)
    kept = [0, 2, 3, 5]
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(env, name).numpy()[kept], value[kept])
    assert not np.any(env.state.numpy()[[1, 4]] == before["state"][[1, 4]])
    np.testing.assert_array_equal(env.elapsed_steps.numpy()[[1, 4]], [0, 0])
    np.testing.assert_array_equal(env.reward.numpy()[[1, 4]], [0, 0])
    assert not env.done.numpy().any() and not env.terminated.numpy().any()


def test_initial_states_within_gymnasium_ranges():
    pendulum = Pendulum(20000, seed=11)
    pendulum.reset()
    theta, theta_dot = pendulum.state.numpy().T
    assert -math.pi <= theta.min() < -3.1 and 3.1 < theta.max() < math.pi
    assert -1 <= theta_dot.min() < -0.99 and 0.99 < theta_dot.max() < 1
    assert abs(theta.mean()) < 0.05 and abs(theta_dot.mean()) < 0.02
    observ = pendulum.observ.numpy()
    np.testing.assert_allclose(observ[:, 0], np.cos(theta), atol=1e-6)
    np.testing.assert_allclose(observ[:, 1], np.sin(theta), atol=1e-6)
    cartpole = CartPole(20000, seed=12)
    cartpole.reset()
    state = cartpole.state.numpy()
    assert (state >= -0.05).all() and (state < 0.05).all()
    assert (state.min(0) < -0.0499).all() and (state.max(0) > 0.0499).all()
    np.testing.assert_array_equal(cartpole.observ.numpy(), state.astype(np.float32))
    # Another seed, other states; the same seed, the same states.
    assert not np.allclose(CartPole(3, seed=13).reset().numpy(), state[:3])
    np.testing.assert_array_equal(CartPole(3, seed=12).reset().numpy(),
                                  state[:3].astype(np.float32))


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("env_class", [Pendulum, CartPole])
def test_batchrl_simulate_runs_native_envs(env_class, jit_compile):
    batch, steps = 4, 450
    env = env_class(batch, seed=17)
    algo = MockAlgorithm(env, seed=18)

    @tf.function(jit_compile=jit_compile)
    def run():
        def body(time, dones, scores):
            done, score = simulate(env, algo, False, tf.equal(time, 0))
            return time + 1, dones.write(time, done), scores.write(time, score)
        _, dones, scores = tf.while_loop(
            lambda time, *_: time < steps, body,
            (tf.constant(0), tf.TensorArray(tf.bool, steps), tf.TensorArray(tf.float32, steps)))
        return dones.stack(), scores.stack()

    dones, scores = (x.numpy() for x in run())
    assert np.isfinite(scores).all()
    if env_class is Pendulum:
        # Episodes end exactly every 200 steps, with a negative score.
        ends = [time for time in range(steps) if dones[time].any()]
        assert ends == [199, 399] and dones[ends].all()
        assert (scores <= 0).all() and (scores[ends] < -100).all()
        assert (scores[ends] > -16.2736044 * 200).all()
    else:
        # The score of an episode is its length.
        lengths = np.zeros(batch)
        episodes = 0
        for time in range(steps):
            lengths += 1
            np.testing.assert_array_equal(scores[time], lengths)
            episodes += dones[time].sum()
            lengths[dones[time]] = 0
        assert episodes >= 4 * steps / 100  # Random pushes end episodes within ~20 steps.


def test_configs_select_native_environments():
    assert environments.native_class("batchrl.native_tasks:Pendulum") is Pendulum
    assert environments.native_class("Pendulum-v1") is None
    assert environments.native_class("batchrl.environments.mock:MockEnvironment") is None
    assert environments.gymnasium_id("batchrl.native_tasks:CartPole") == "CartPole-v1"
    config = configs.load("pendulum_native", {"num_agents": 3, "seed": 7})
    assert environments.episode_limit(config) == 200  # Pendulum-v1's registered limit.
    batch_env = environments.create_batch(config)
    assert isinstance(batch_env, Pendulum) and len(batch_env) == 3
    assert batch_env.max_episode_steps == 200
    build_lib.check(config)
    agent = build_lib.build(config, batch_env)
    assert agent.batch_env is batch_env  # Not wrapped in an InGraphBatchEnv.


@pytest.mark.parametrize("name", ["CartPole", "MinAtarBreakout", "Pendulum"])
def test_the_old_name_batchrl_envs_names_the_same_native_tasks(name):
    """`batchrl.envs` (the native tasks' name before `batchrl.native_tasks`) is the new
    module itself, with a DeprecationWarning naming the new path, and an env id in either
    spelling is the class defined in `batchrl.environments.native`."""
    defined = getattr(importlib.import_module("batchrl.environments.native"), name)
    sys.modules.pop("batchrl.envs", None)  # Imported anew, so that it warns here.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("batchrl.envs")
    assert [str(warning.message) for warning in caught
            if warning.category is DeprecationWarning] == [
        "batchrl.envs moved to batchrl.native_tasks; the old path goes in the next release"]
    assert old is importlib.import_module("batchrl.native_tasks")
    for env in (f"batchrl.envs:{name}", f"batchrl.native_tasks:{name}"):
        environments.check_env_id(env)
        assert environments.native_class(env) is defined, env


def test_a_config_naming_the_old_module_builds_the_same_environment():
    """`configs.load` writes the old module's env under the new name (with a warning); an
    env id of the old module built as it is (e.g. by code that makes its own `Config`)
    gives the same class."""
    with pytest.warns(DeprecationWarning, match="batchrl.envs:Pendulum is now"):
        loaded = configs.load("pendulum_native", {"env": "batchrl.envs:Pendulum",
                                                  "num_agents": 2})
    new = configs.load("pendulum_native", {"num_agents": 2})
    assert new.env == loaded.env == "batchrl.native_tasks:Pendulum"
    old = configs.Config(new, env="batchrl.envs:Pendulum")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        batch_envs = [environments.create_batch(config) for config in (old, new)]
    defined = importlib.import_module("batchrl.environments.native.pendulum").Pendulum
    assert [type(batch_env) for batch_env in batch_envs] == [defined, defined]
    assert [len(batch_env) for batch_env in batch_envs] == [2, 2]
    assert environments.gymnasium_id(old.env) == environments.gymnasium_id(new.env) \
        == "Pendulum-v1"

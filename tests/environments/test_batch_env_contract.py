"""The batch-environment contract (DESIGN.md, Environments) on every backend: `BatchEnv`
in-process, `ParallelBatchEnv` workers, EnvPool and Ray actors (on the two-node cluster of
the `ray_cluster` fixture), each on the same Gymnasium tasks."""

import functools
import importlib

import numpy as np
import pytest
from gymnasium import spaces

from batchrl import configs, environments
from batchrl.environments.envpool import EnvPoolBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.processes import ParallelBatchEnv
from batchrl.environments.ray.driver import RayBatchEnv

BACKENDS = ["batch_env", "parallel_batch_env", "envpool", "ray"]


def make_batch(backend, task, num_envs, max_episode_steps=None, wrap=True):
    """`num_envs` environments of the Gymnasium / EnvPool task `task` on `backend`; with
    `wrap=False`, a `module:Class` task's instances as they are (no `standard_wrappers`)."""
    if backend == "envpool":
        return EnvPoolBatchEnv(task, num_envs, num_threads=2,
                               max_episode_steps=max_episode_steps)
    if wrap:
        constructor = functools.partial(environments.create, task, max_episode_steps)
    else:
        module, _, name = task.partition(":")
        constructor = getattr(importlib.import_module(module), name)
    if backend == "parallel_batch_env":
        return ParallelBatchEnv(constructor, num_envs, num_workers=2, name=task)
    if backend == "ray":
        return RayBatchEnv(constructor, num_envs, num_workers=2, name=task)
    return BatchEnv([constructor() for _ in range(num_envs)], blocking=True)


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


@pytest.mark.parametrize("task,observ_shape,action_space", [
    ("Pendulum-v1", (3,), spaces.Box(-1.0, 1.0, (1,), np.float32)),
    ("CartPole-v1", (4,), spaces.Discrete(2)),
    ("HalfCheetah-v5", (17,), spaces.Box(-1.0, 1.0, (6,), np.float32)),
])
def test_spaces_shapes_and_dtypes(backend, task, observ_shape, action_space):
    with make_batch(backend, task, 3) as batch_env:
        assert len(batch_env) == 3
        assert batch_env.observation_space.shape == observ_shape
        assert batch_env.observation_space.dtype == np.float32
        assert batch_env.action_space == action_space
        observ, infos = batch_env.reset(seed=0)
        assert observ.shape == (3, *observ_shape) and observ.dtype == np.float32
        assert len(infos) == 3
        actions = np.stack([action_space.sample() for _ in range(3)])
        observ, reward, terminated, truncated, infos = batch_env.step(actions)
        assert observ.shape == (3, *observ_shape) and observ.dtype == np.float32
        assert reward.shape == (3,) and reward.dtype == np.float32
        assert terminated.dtype == bool and truncated.dtype == bool
        assert terminated.shape == truncated.shape == (3,) and len(infos) == 3


def test_seed_makes_runs_repeatable_and_env_i_gets_seed_plus_i(backend):
    # The same actions for every env, so that env 1 of one run and env 0 of another match.
    actions = np.repeat(np.random.default_rng(0).uniform(-1, 1, (5, 1, 1)), 3, axis=1)

    def run(seed):
        with make_batch(backend, "Pendulum-v1", 3) as batch_env:
            outputs = [batch_env.reset(seed=seed)[0]]
            outputs += [batch_env.step(action)[0] for action in actions]
            return np.stack(outputs)

    first, again, shifted = run(7), run(7), run(8)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first[:, 1], shifted[:, 0])  # Env 1 of seed 7 = env 0 of 8.
    assert not np.array_equal(first[:, 0], first[:, 1])


def test_reset_of_a_subset_leaves_the_others_running(backend):
    actions = np.random.default_rng(1).uniform(-1, 1, (6, 4, 1))
    with make_batch(backend, "Pendulum-v1", 4) as batch_env, \
            make_batch(backend, "Pendulum-v1", 4) as twin:
        for env in (batch_env, twin):
            env.reset(seed=3)
            for action in actions[:3]:
                env.step(action)
        observ, infos = batch_env.reset(np.array([3, 1]))
        assert observ.shape == (2, 3) and len(infos) == 2
        for action in actions[3:]:
            got, expected = batch_env.step(action)[0], twin.step(action)[0]
            np.testing.assert_array_equal(got[[0, 2]], expected[[0, 2]])
            assert not np.allclose(got[[1, 3]], expected[[1, 3]])
        observ, infos = batch_env.reset([])
        assert observ.shape == (0, 3) and len(infos) == 0
        with pytest.raises(IndexError, match="batch index 4"):
            batch_env.reset([0, 4])


def test_time_limit_truncates_and_returns_the_final_observation(backend):
    with make_batch(backend, "Pendulum-v1", 2, max_episode_steps=4) as batch_env:
        batch_env.reset(seed=0)
        for step in range(1, 5):
            observ, _, terminated, truncated, _ = batch_env.step(np.full((2, 1), 0.5))
            assert not terminated.any()
            assert truncated.all() == (step == 4) and truncated.any() == (step == 4)
        # The final observation, not the first of a new episode: the next episode begins
        # only with reset, from another state.
        first, _ = batch_env.reset()
        assert not np.allclose(first, observ)
        _, _, _, truncated, _ = batch_env.step(np.zeros((2, 1)))
        assert not truncated.any()


def test_falling_pole_terminates_without_truncation(backend):
    with make_batch(backend, "CartPole-v1", 1) as batch_env:
        batch_env.reset(seed=0)
        for _ in range(30):  # Always pushing right: the pole falls within ~10 steps.
            observ, reward, terminated, truncated, _ = batch_env.step(np.array([1]))
            if terminated[0] or truncated[0]:
                break
        assert terminated[0] and not truncated[0]
        assert abs(observ[0, 2]) > 0.2  # The pole angle past the 12 degree limit.
        assert reward[0] == 1.0


def test_wrong_action_shape_raises_and_keeps_the_batch_usable(backend):
    with make_batch(backend, "HalfCheetah-v5", 2) as batch_env:
        batch_env.reset(seed=0)
        with pytest.raises(ValueError, match=r"expected actions of shape \(2, 6\).*\(2, 5\)"):
            batch_env.step(np.zeros((2, 5)))
        observ, *_ = batch_env.step(np.zeros((2, 6)))
        assert observ.shape == (2, 17)


def test_non_finite_action_is_refused_naming_the_env(backend):
    with make_batch(backend, "Pendulum-v1", 3) as batch_env:
        batch_env.reset(seed=0)
        for value in (np.nan, np.inf):
            actions = np.zeros((3, 1), np.float32)
            actions[1] = value
            with pytest.raises(ValueError, match=rf"^env 1\b.*non-finite action: \[{value}\]$"):
                batch_env.step(actions)
            observ, *_ = batch_env.step(np.zeros((3, 1)))  # Nothing was stepped; usable.
            assert np.isfinite(observ).all()


def test_discrete_actions_outside_the_space_are_refused(backend):
    with make_batch(backend, "CartPole-v1", 3) as batch_env:
        batch_env.reset(seed=0)
        with pytest.raises(ValueError, match="convertible to int64.*got dtype float64"):
            batch_env.step([0.9, 1.7, 5.0])  # Not truncated to 0, 1 and 5.
        with pytest.raises(ValueError, match=r"^env 2\b.*action 5, outside the action space "
                                             r"Discrete\(2\)"):
            batch_env.step(np.array([0, 1, 5]))
        with pytest.raises(ValueError, match=r"^env 0\b.*action -1, outside"):
            batch_env.step(np.array([-1, 1, 1], np.int32))
        # Nothing was stepped: the poles stand after 1 step from a seeded reset.
        _, reward, terminated, truncated, _ = batch_env.step(np.array([0, 1, 1], np.int32))
        assert reward.tolist() == [1.0] * 3 and not (terminated | truncated).any()


def test_discrete_action_n_is_the_first_refused(backend):
    with make_batch(backend, "CartPole-v1", 3) as batch_env:
        batch_env.reset(seed=0)
        with pytest.raises(ValueError, match=r"^env 1\b.* was given the action 2, outside the "
                                             r"action space Discrete\(2\)$"):
            batch_env.step(np.array([1, 2, 0]))  # Discrete(2): 0 and 1.
        _, reward, terminated, truncated, _ = batch_env.step(np.array([1, 1, 0]))
        assert reward.tolist() == [1.0] * 3 and not (terminated | truncated).any()


def test_discrete_space_with_a_start_takes_start_to_start_plus_n_minus_1(backend):
    """`Discrete(3, start=1)` as the environment declares it (no `standard_wrappers`, which
    would make it `Discrete(3)`): 1, 2 and 3 reach the environments, 0 and 4 are refused."""
    if backend == "envpool":
        pytest.skip("EnvPool has no task of a Discrete space that does not start at 0")
    with make_batch(backend, "tests.echo_environments:EchoOffsetDiscrete", 3,
                    wrap=False) as batch_env:
        assert batch_env.action_space == spaces.Discrete(3, start=1)
        batch_env.reset(seed=0)
        for bad, row, value in (([1, 2, 0], 2, 0), ([4, 2, 3], 0, 4)):
            with pytest.raises(ValueError, match=rf"^env {row}\b.* was given the action {value}, "
                                                 r"outside the action space Discrete\(3, "
                                                 r"start=1\)$"):
                batch_env.step(np.array(bad))
        observ, *_ = batch_env.step(np.array([3, 1, 2]))
        assert observ[:, 0].tolist() == [3.0, 1.0, 2.0]  # Each environment echoes its action.


def test_reset_refuses_repeated_or_malformed_indices(backend):
    with make_batch(backend, "Pendulum-v1", 3) as batch_env:
        first, _ = batch_env.reset(seed=0)
        with pytest.raises(ValueError, match=r"batch index 1 appears more than once in the "
                                             r"indices to reset: \[1, 1\]"):
            batch_env.reset([1, 1])
        with pytest.raises(ValueError, match=r"batch index 1 appears more than once in the "
                                             r"indices to reset: \[1, 0, 1\]"):
            batch_env.reset(np.array([1, 0, 1]))  # Not adjacent: a sort must find them.
        with pytest.raises(ValueError, match="1-D sequence of integers"):
            batch_env.reset([0.5])
        with pytest.raises(ValueError, match="1-D sequence of integers"):
            batch_env.reset([[0], [1]])
        # Nothing was reset: the batch steps on from the seeded states.
        observ, *_ = batch_env.step(np.zeros((3, 1)))
        np.testing.assert_allclose(observ, pendulum_step(first, np.zeros((3, 1)))[0],
                                   atol=1e-5)


def pendulum_step(observ, actions):
    """Pendulum-v1's next observation and reward for observations float `[B, 3]` = (cos θ,
    sin θ, θ') and batchrl's actions `[B, 1]` in [-1, 1] (clipped, then mapped to the torque
    u in [-2, 2] N m), by Gymnasium's equations (gymnasium/envs/classic_control/pendulum.py):
    θ'_new = clip(θ' + (3 g / (2 l) sin θ + 3 / (m l²) u) dt, -8, 8), θ_new = θ + θ'_new dt,
    reward = -(normalize(θ)² + 0.1 θ'² + 0.001 u²), with g = 10, m = l = 1, dt = 0.05."""
    g, m, length, dt = 10.0, 1.0, 1.0, 0.05
    observ = np.asarray(observ, np.float64)
    theta, speed = np.arctan2(observ[:, 1], observ[:, 0]), observ[:, 2]
    torque = np.clip(2.0 * np.clip(np.asarray(actions, np.float64)[:, 0], -1, 1), -2, 2)
    reward = -(theta ** 2 + 0.1 * speed ** 2 + 0.001 * torque ** 2)  # arctan2: θ in (-π, π].
    speed = np.clip(speed + (3 * g / (2 * length) * np.sin(theta)
                             + 3.0 / (m * length ** 2) * torque) * dt, -8, 8)
    theta = theta + speed * dt
    return np.stack([np.cos(theta), np.sin(theta), speed], axis=1), reward


def test_every_step_follows_pendulum_dynamics_through_the_time_limit(backend):
    # Two episodes of 5 steps, and a partial reset: every observation, the final one at the
    # limit included, must be the dynamics' successor of the one before (an auto-reset
    # observation, or one of another environment, is not).
    actions = np.random.default_rng(2).uniform(-1.5, 1.5, (13, 3, 1)).astype(np.float32)
    with make_batch(backend, "Pendulum-v1", 3, max_episode_steps=5) as batch_env:
        observ, _ = batch_env.reset(seed=0)
        for step, action in enumerate(actions, start=1):
            expected, expected_reward = pendulum_step(observ, action)
            observ, reward, terminated, truncated, _ = batch_env.step(action)
            np.testing.assert_allclose(observ, expected, atol=1e-5, err_msg=f"step {step}")
            np.testing.assert_allclose(reward, expected_reward, rtol=1e-5, atol=1e-5)
            assert not terminated.any()
            assert truncated.tolist() == [step in (5, 10)] * 2 + [step in (5, 13)]
            if step == 5:
                observ, _ = batch_env.reset()
            elif step == 8:  # Env 2 begins again; its episode ends at step 13.
                observ = observ.copy()
                observ[2] = batch_env.reset([2])[0][0]
            elif step == 10:
                observ = observ.copy()
                observ[[1, 0]] = batch_env.reset(np.array([1, 0]))[0]


def test_envpool_action_bounds_are_mapped_from_minus_one_one():
    # Pendulum's torque bounds are [-2, 2]: the agent's 1.0 is 2.0 N m, and actions outside
    # [-1, 1] are clipped. The swing from rest under a constant torque tells them apart.
    def speed(action):
        with EnvPoolBatchEnv("Pendulum-v1", 1, num_threads=1) as batch_env:
            batch_env.reset(seed=0)
            for _ in range(3):
                observ, *_ = batch_env.step(np.array([[action]]))
            return observ[0, 2]

    assert speed(1.0) == pytest.approx(speed(5.0))
    assert speed(1.0) > speed(0.5) > speed(0.0)


def test_envpool_refuses_to_step_an_ended_episode():
    with EnvPoolBatchEnv("Pendulum-v1", 2, num_threads=1, max_episode_steps=2) as batch_env:
        with pytest.raises(RuntimeError, match="env 0 .*reset it before stepping"):
            batch_env.step(np.zeros((2, 1)))
        batch_env.reset(seed=0)
        batch_env.step(np.zeros((2, 1)))
        batch_env.step(np.zeros((2, 1)))  # Both episodes end (time limit).
        batch_env.reset([1])
        with pytest.raises(RuntimeError, match="env 0 .*reset it before stepping"):
            batch_env.step(np.zeros((2, 1)))
        batch_env.reset([0])
        *_, infos = batch_env.step(np.zeros((2, 1)))
        assert [info["elapsed_step"] for info in infos] == [1, 1]  # Stepped, not reset.


def test_envpool_seeded_reset_needs_every_env():
    with EnvPoolBatchEnv("Pendulum-v1", 3, num_threads=1) as batch_env:
        with pytest.raises(ValueError, match="resets all 3 environments"):
            batch_env.reset([0, 2], seed=1)
        batch_env.close()
        batch_env.close()  # Idempotent.


def test_envpool_deepmind_control_observations_are_flattened():
    with EnvPoolBatchEnv("CheetahRun-v1", 2, num_threads=1) as batch_env:
        assert batch_env.observation_space == spaces.Box(-np.inf, np.inf, (17,), np.float32)
        observ, _ = batch_env.reset(seed=0)
        assert observ.shape == (2, 17) and np.isfinite(observ).all()


def test_envpool_config_key_and_errors():
    config = configs.load("cheetah", ["env_backend=envpool", "num_agents=2",
                                      "num_workers=1"])
    assert environments.episode_limit(config) == 1000
    assert environments.gymnasium_id(config.env) == "HalfCheetah-v5"
    assert environments.gymnasium_id("envpool:CheetahRun-v1") is None
    assert environments.native_class(config.env) is None
    batch_env = environments.create_batch(config)
    try:
        assert isinstance(batch_env, EnvPoolBatchEnv) and len(batch_env) == 2
        observ, *_ = batch_env.step(np.zeros((2, 6)))  # Reset (and seeded) by create_batch.
        assert observ.shape == (2, 17)
    finally:
        batch_env.close()
    with pytest.raises(configs.ConfigError, match="close matches: HalfCheetah-v5"):
        environments.check_env_id("envpool:HalfCheeta-v5")

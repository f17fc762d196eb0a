"""The EnvPool backend against Gymnasium and the config: `terminated` at the time limit,
settings in `env_kwargs`, and the episode bookkeeping after an error (issue 31, items 1, 4
and 5). The checks every backend shares are in test_batch_env_contract.py."""

import numpy as np
import pytest

from batchrl import configs, environments
from batchrl.environments import envpool as envpool_env
from batchrl.environments.envpool import EnvPoolBatchEnv


def _twin(task, limit, seed, observ):
    """Gymnasium's environment of `task` as batchrl builds it (`environments.create`), put
    in the state whose observation is `observ`: EnvPool and Gymnasium draw different reset
    noise from the same seed, but Hopper's and HalfCheetah's observations are the whole
    state but the x position, on which the dynamics do not depend."""
    env = environments.create(task, limit)
    env.reset(seed=seed)
    nq = env.unwrapped.model.nq
    env.unwrapped.set_state(np.concatenate([[0.0], observ[:nq - 1]]), observ[nq - 1:])
    return env


@pytest.mark.parametrize("limit", [27, 100, None])
@pytest.mark.parametrize("task", ["Hopper-v5", "HalfCheetah-v5"])
def test_flags_agree_with_gymnasium_through_the_time_limit(task, limit):
    # Env i acts with the random stream of seed i. Hopper then falls at steps 27, 13, 15 and
    # 15: with a limit of 27, env 0 falls on the last allowed step (EnvPool 1.2.5 says
    # truncated only, Gymnasium's TimeLimit terminated and truncated). HalfCheetah never
    # falls: every episode is truncated at the limit.
    steps = limit or envpool_env.episode_limit(task)
    with EnvPoolBatchEnv(task, 4, num_threads=1, max_episode_steps=limit) as batch_env:
        observ, _ = batch_env.reset(seed=0)
        twins = [_twin(task, steps, i, observ[i]) for i in range(4)]
        shape = batch_env.action_space.shape
        streams = [np.random.default_rng(i) for i in range(4)]
        ends = [None] * 4
        for step in range(1, steps + 1):
            actions = np.stack([rng.uniform(-1, 1, shape) for rng in streams])
            observ, _, terminated, truncated, _ = batch_env.step(actions.astype(np.float32))
            for i in range(4):
                if ends[i] is not None:
                    continue
                twin_observ, _, twin_terminated, twin_truncated, _ = twins[i].step(
                    actions[i].astype(np.float32))
                assert (terminated[i], truncated[i]) == (twin_terminated, twin_truncated), (
                    f"env {i}, step {step}")
                if task == "Hopper-v5":  # The same trajectory (HalfCheetah's is chaotic).
                    np.testing.assert_allclose(observ[i], twin_observ, atol=1e-4)
                if twin_terminated or twin_truncated:
                    ends[i] = (step, bool(twin_terminated), bool(twin_truncated))
            ended = np.flatnonzero(terminated | truncated)
            if all(ends):
                break
            batch_env.reset(ended)  # Ends no longer compared: the batch steps on.
    if task == "Hopper-v5":
        assert ends == [(27, True, limit == 27), (13, True, False), (15, True, False),
                        (15, True, False)]
    else:
        assert ends == [(steps, False, True)] * 4


def _envpool_config(*overrides):
    return configs.load("pendulum", ["env_backend=envpool", "num_agents=2",
                                     "num_workers=null", *overrides])


def test_env_kwargs_max_episode_steps_sets_the_episode_length():
    config = _envpool_config("env_kwargs={max_episode_steps: 300}", "max_length=null")
    assert environments.episode_limit(config) == 300  # Sizes the memory (build.py).
    batch_env = environments.create_batch(config)
    try:
        for step in range(1, 301):
            *_, terminated, truncated, _ = batch_env.step(np.zeros((2, 1)))
            assert not terminated.any() and truncated.all() == (step == 300), step
            assert truncated.any() == (step == 300)
    finally:
        batch_env.close()


def test_env_kwargs_num_threads_is_respected():
    batch_env = environments.create_batch(_envpool_config("env_kwargs={num_threads: 3}"))
    try:
        assert batch_env._pool.config["num_threads"] == 3  # EnvPool's own record.
        assert batch_env.num_threads == 3
    finally:
        batch_env.close()
    batch_env = environments.create_batch(_envpool_config("num_workers=1"))
    try:
        assert batch_env._pool.config["num_threads"] == 1
    finally:
        batch_env.close()


@pytest.mark.parametrize("overrides, message", [
    (["env_kwargs={max_episode_steps: 300}", "max_length=500"],
     r"^config keys 'max_length' \(500\) and 'env_kwargs' \(max_episode_steps: 300\) "
     r"contradict each other"),
    (["env_kwargs={num_threads: 4}", "num_workers=2"],
     r"^config keys 'num_workers' \(2\) and 'env_kwargs' \(num_threads: 4\) contradict"),
    (["env_kwargs={max_episode_step: 300}"],
     r"^config key 'env_kwargs': EnvPool task Pendulum-v1 has no option 'max_episode_step' "
     r"\(close matches: max_episode_steps\)"),
    (["env_kwargs={num_envs: 4}"], r"'num_envs' is batchrl's to set.*num_agents"),
    (["env_kwargs={num_threads: -3}"], r"num_threads \(option\) must be an int >= 1"),
])
def test_contradicting_or_unknown_env_kwargs_are_one_line_config_errors(overrides, message):
    config = _envpool_config(*overrides)
    for call in (environments.episode_limit, environments.create_batch):
        with pytest.raises(configs.ConfigError, match=message) as caught:
            call(config)
        assert "\n" not in str(caught.value)
    # The same settings given to the class directly.
    with pytest.raises(ValueError, match="given twice: 2 as an argument and 4"):
        EnvPoolBatchEnv("Pendulum-v1", 2, num_threads=2, kwargs={"num_threads": 4})


def test_non_finite_value_and_ended_episodes_must_be_reset_before_stepping():
    # Envs 1 and 2 reach the time limit in the step in which env 0 returns a NaN
    # observation: after the ValueError, none of them may be stepped before a reset (EnvPool
    # would silently reset them in place of the step).
    zeros = np.zeros((3, 1), np.float32)
    with EnvPoolBatchEnv("Pendulum-v1", 3, num_threads=1, max_episode_steps=3) as batch_env:
        batch_env.reset(seed=0)
        batch_env.step(zeros)
        batch_env.step(zeros)
        batch_env.reset([0])
        pool_step = batch_env._pool.step

        def poisoned_step(*args):
            observ, *rest = pool_step(*args)
            observ = np.array(observ)
            observ[0, 1] = np.nan  # EnvPool's row 0 is env 0 (synchronous mode).
            return observ, *rest

        batch_env._pool.step = poisoned_step
        with pytest.raises(ValueError, match=r"env 0 \(Pendulum-v1\) returned a non-finite "
                                             r"observation"):
            batch_env.step(zeros)
        batch_env._pool.step = pool_step
        with pytest.raises(RuntimeError, match=r"env 0 .*reset it before stepping"):
            batch_env.step(zeros)
        batch_env.reset([0])
        with pytest.raises(RuntimeError, match=r"env 1 .*reset it before stepping"):
            batch_env.step(zeros)
        batch_env.reset([1, 2])
        *_, truncated, infos = batch_env.step(zeros)
        assert [info["elapsed_step"] for info in infos] == [1, 1, 1]  # Stepped, not reset.
        assert not truncated.any()


def test_atari_frames_stay_uint8_through_the_batch_and_the_graph():
    import tensorflow as tf

    from batchrl.environments.in_graph import InGraphBatchEnv

    batch = EnvPoolBatchEnv("Pong-v5", 2, num_threads=1, seed=0, max_episode_steps=50)
    try:
        assert batch.observation_space.dtype == np.uint8
        assert batch.observation_space.shape == (4, 84, 84)
        observ, _ = batch.reset(seed=0)
        assert observ.dtype == np.uint8 and observ.shape == (2, 4, 84, 84)
        observ, *_ = batch.step(np.array([0, 1]))
        assert observ.dtype == np.uint8 and observ.max() > 0
        in_graph = InGraphBatchEnv(batch)
        assert in_graph.observ.dtype == tf.uint8
        in_graph.reset()
        in_graph.simulate(tf.constant([2, 3], tf.int32))
        np.testing.assert_array_equal(in_graph.observ.numpy().shape, (2, 4, 84, 84))
    finally:
        batch.close()


@pytest.mark.parametrize("task, options, observation, action, task_action", [
    # Atari: uint8 stacks of 84 x 84 frames, as many as `stack_num`; Pong's 6 actions.
    ("Pong-v5", {"episodic_life": True}, ((4, 84, 84), np.uint8), (6,), (6,)),
    ("Pong-v5", {"stack_num": 2}, ((2, 84, 84), np.uint8), (6,), (6,)),
    # Pendulum's torque in [-2, 2], declared as [-1, 1].
    ("Pendulum-v1", None, ((3,), np.float32), ((-1.0,), (1.0,)), ((-2.0,), (2.0,))),
    # DeepMind Control's Dict of position (8) and velocity (9), flattened.
    ("CheetahRun-v1", None, ((17,), np.float32), ((-1.0,) * 6, (1.0,) * 6),
     ((-1.0,) * 6, (1.0,) * 6)),
])
def test_task_spaces_come_from_envpools_spec(task, options, observation, action,
                                             task_action):
    """What `batchrl-export` serves: the observations as the batch gives them, the actions
    in the task's own bounds (no pool is built)."""
    from gymnasium import spaces

    observation_space, action_space, task_action_space = envpool_env.task_spaces(
        task, options)
    assert (observation_space.shape, observation_space.dtype) == observation
    for space, expected in ((action_space, action), (task_action_space, task_action)):
        if len(expected) == 1:
            assert space == spaces.Discrete(expected[0])
        else:
            assert space.dtype == np.float32
            np.testing.assert_array_equal(space.low, expected[0])
            np.testing.assert_array_equal(space.high, expected[1])
    batch = EnvPoolBatchEnv(task, 1, num_threads=1, kwargs=options)
    try:  # The spaces of the batch itself.
        assert batch.observation_space == observation_space
        assert batch.action_space == action_space
    finally:
        batch.close()


def test_a_task_spec_with_default_options_is_made_once_per_process(monkeypatch):
    """Checking a config, building its algorithm and its batch each read the task's spec
    (its episode limit, its option names, its spaces); an Atari task's takes about 0.1 s
    (the ROM is read), so it is made once. A spec of other options is made each time, and
    an unknown task id still raises."""
    import envpool

    made = []
    make_spec = envpool.make_spec
    monkeypatch.setattr(envpool, "make_spec", lambda task_id, **options: (
        made.append((task_id, options)), make_spec(task_id, **options))[1])
    envpool_env._default_spec.cache_clear()
    config = configs.load("pong", ["num_agents=2"])
    environments.check_backend(config)
    limit = environments.episode_limit(config)
    spaces = envpool_env.task_spaces("Pong-v5")
    with environments.create_batch(config) as batch_env:
        assert batch_env.observation_space == spaces[0]
    assert limit == make_spec("Pong-v5").config.max_episode_steps
    assert [task_id for task_id, options in made if not options] == ["Pong-v5"]
    envpool_env.task_spaces("Pong-v5", {"stack_num": 2})
    envpool_env.task_spaces("Pong-v5", {"stack_num": 2})
    assert made[-2:] == [("Pong-v5", {"stack_num": 2})] * 2
    with pytest.raises(Exception, match="Pong-v9"):
        envpool_env.episode_limit("Pong-v9")
    envpool_env._default_spec.cache_clear()

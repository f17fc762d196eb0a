"""Tests of batchrl.environments.wrappers: ExternalProcess and standard_wrappers."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import cloudpickle
import gymnasium
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.classic_control import PendulumEnv

from batchrl.environments.wrappers import ExternalProcess, WorkerError, standard_wrappers

# The environments below are sent to workers by value, so that workers need not import this
# test module (whatever pytest's import mode).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

make_pendulum = functools.partial(gymnasium.make, "Pendulum-v1")


class ProbeEnv(gymnasium.Env):
    """Valid environment with extra methods to probe the worker."""

    def __init__(self, fail_in_step=False, step_sleep=0.0):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.fail_in_step = fail_in_step
        self.step_sleep = step_sleep
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.zeros(2, np.float32), {"options": options}

    def step(self, action):
        if self.fail_in_step:
            explode_in_step(self.count)
        if self.step_sleep:
            time.sleep(self.step_sleep)
        self.count += 1
        return np.full(2, self.count, np.float32), float(action[0]), False, False, {}

    def scaled_count(self, factor, offset=0):
        return self.count * factor + offset

    def loaded_modules(self):
        return sorted(sys.modules)

    def pid(self):
        return os.getpid()

    @property
    def broken_property(self):
        raise KeyError("broken-property-7")


def explode_in_step(count):
    raise ValueError(f"boom-{count}-from-the-worker")


def failing_constructor():
    raise RuntimeError("constructor-failed-13")


@pytest.fixture
def probe():
    env = ExternalProcess(ProbeEnv, name="env 5 (probe)", timeout=10.0)
    yield env
    env.close()


def assert_steps_equal(a, b):
    observ_a, reward_a, terminated_a, truncated_a, _ = a
    observ_b, reward_b, terminated_b, truncated_b, _ = b
    np.testing.assert_array_equal(observ_a, observ_b)
    assert observ_a.dtype == observ_b.dtype
    assert reward_a == reward_b
    assert terminated_a == terminated_b
    assert truncated_a == truncated_b


def test_external_process_matches_in_process_env():
    local = make_pendulum()
    with ExternalProcess(make_pendulum, name="env 0 (Pendulum-v1)") as remote:
        assert remote.observation_space == local.observation_space
        assert remote.action_space == local.action_space
        assert remote.spec.id == "Pendulum-v1"
        assert remote.render_mode is None
        observ_remote, _ = remote.reset(seed=7)
        observ_local, _ = local.reset(seed=7)
        np.testing.assert_array_equal(observ_remote, observ_local)
        actions = np.random.default_rng(0).uniform(-2, 2, (20, 1)).astype(np.float32)
        for action in actions[:10]:
            assert_steps_equal(remote.step(action), local.step(action))
        # Promises.
        for action in actions[10:]:
            promise = remote.step(action, blocking=False)
            assert callable(promise)
            result = promise()
            assert_steps_equal(result, local.step(action))
            assert promise() is result  # A promise can be called again.
        promise = remote.reset(seed=3, blocking=False)
        np.testing.assert_array_equal(promise()[0], local.reset(seed=3)[0])


def test_promises_can_be_resolved_out_of_order():
    local = make_pendulum()
    with ExternalProcess(make_pendulum) as remote:
        remote.reset(seed=1)
        local.reset(seed=1)
        actions = [np.array([a], np.float32) for a in (-1.5, 0.5, 2.0)]
        promises = [remote.step(action, blocking=False) for action in actions]
        expected = [local.step(action) for action in actions]
        for index in (2, 0, 1):
            assert_steps_equal(promises[index](), expected[index])
        # A promise that is never resolved does not disturb later requests.
        remote.step(actions[0], blocking=False)
        local.step(actions[0])
        assert_steps_equal(remote.step(actions[1]), local.step(actions[1]))


def test_call_and_attribute_access(probe):
    assert probe.reset(seed=1, options={"a": 1})[1] == {"options": {"a": 1}}
    probe.step(np.zeros(1, np.float32))
    probe.step(np.zeros(1, np.float32))
    assert probe.count == 2
    assert probe.scaled_count(10, offset=3) == 23
    assert probe.call("scaled_count", 10, offset=3) == 23
    assert probe.fail_in_step is False
    # Cached attributes are read once.
    space = probe.observation_space
    assert probe.observation_space is space
    assert probe.action_space is probe.action_space
    assert probe.pid() != os.getpid()
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = probe.no_such_attribute
    assert not hasattr(probe, "no_such_attribute")
    with pytest.raises(WorkerError, match="broken-property-7"):
        _ = probe.broken_property


def test_worker_exception_is_reraised_with_traceback():
    with ExternalProcess(
        functools.partial(ProbeEnv, fail_in_step=True), name="env 3 (failing)"
    ) as env:
        env.reset()
        with pytest.raises(WorkerError) as info:
            env.step(np.zeros(1, np.float32))
        message = str(info.value)
        assert "env 3 (failing)" in message
        assert "Traceback" in message
        assert "ValueError: boom-0-from-the-worker" in message
        assert "explode_in_step" in message
        # The worker keeps serving, also through promises.
        assert env.reset()[0].shape == (2,)
        promise = env.step(np.zeros(1, np.float32), blocking=False)
        with pytest.raises(WorkerError, match="boom-0"):
            promise()
        assert env.call("scaled_count", 1) == 0


def test_constructor_exception():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        ExternalProcess(failing_constructor, name="env 9 (bad)")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "env 9 (bad)" in message
    assert "RuntimeError: constructor-failed-13" in message
    assert "failing_constructor" in message


def test_constructor_lambda_and_unknown_env_id():
    with pytest.raises(WorkerError, match="NoSuchEnv"):
        ExternalProcess(lambda: gymnasium.make("NoSuchEnv-v0"))


def test_killed_worker_is_reported_quickly(probe):
    probe.reset()
    os.kill(probe.pid(), signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"env 5 \(probe\).*(SIGKILL|exit code -9)"):
        probe.step(np.zeros(1, np.float32))
    assert time.monotonic() - start < 5.0  # Not after the probe's 10 s timeout.
    with pytest.raises(WorkerError):  # Stays broken.
        probe.reset()
    probe.close()


def test_worker_killed_while_waiting_is_reported_quickly():
    env = ExternalProcess(functools.partial(ProbeEnv, step_sleep=30.0), timeout=60.0)
    try:
        env.reset()
        pid = env.pid()
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
        start = time.monotonic()
        with pytest.raises(WorkerError, match="exit code -9"):
            env.step(np.zeros(1, np.float32))
        assert time.monotonic() - start < 15.0  # Not after the 30 s step or 60 s timeout.
    finally:
        env.close()


def test_hung_worker_times_out_and_is_killed():
    env = ExternalProcess(
        functools.partial(ProbeEnv, step_sleep=60.0), name="env 1 (hung)", timeout=1.0
    )
    try:
        env.reset()
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"env 1 \(hung\).*did not answer within 1 s"):
            env.step(np.zeros(1, np.float32))
        assert 0.9 < time.monotonic() - start < 30.0  # The hang lasts 60 s.
        assert not env._process.is_alive()
    finally:
        env.close()


def test_close_ends_the_worker(probe):
    process = probe._process
    assert process.is_alive()
    probe.close()
    assert not process.is_alive()
    assert process.exitcode == 0  # Exited by itself after closing its environment.
    probe.close()  # Idempotent.
    with pytest.raises(WorkerError, match="closed"):
        probe.step(np.zeros(1, np.float32))


def test_garbage_collected_process_is_closed():
    env = ExternalProcess(ProbeEnv)
    process = env._process
    del env
    process.join(10)
    assert not process.is_alive()


def test_worker_does_not_import_tensorflow_or_main(tmp_path):
    with ExternalProcess(ProbeEnv) as env:
        modules = env.loaded_modules()
    assert "tensorflow" not in modules
    assert not any(name.startswith("batchrl.tools.in_graph") for name in modules)
    # A script that creates workers is not re-imported by them.
    marker = tmp_path / "imported_by_worker"
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import functools
            import gymnasium
            if __name__ != "__main__":
                open({str(marker)!r}, "w").close()
            from batchrl.environments.wrappers import ExternalProcess
            if __name__ == "__main__":
                env = ExternalProcess(functools.partial(gymnasium.make, "Pendulum-v1"))
                env.reset(seed=0)
                env.close()
                print("ok")
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert not marker.exists()


# standard_wrappers.


def test_standard_wrappers_rescale_and_clip_pendulum_actions():
    raw = gymnasium.make("Pendulum-v1")
    wrapped = standard_wrappers(gymnasium.make("Pendulum-v1"))
    max_torque = raw.action_space.high[0]
    assert max_torque == 2.0
    assert wrapped.action_space == spaces.Box(-1.0, 1.0, (1,), np.float32)
    assert wrapped.observation_space.dtype == np.float32
    raw.reset(seed=0)
    observ, _ = wrapped.reset(seed=0)
    assert observ.dtype == np.float32
    pairs = [(1.0, max_torque), (-1.0, -max_torque), (0.5, 1.0), (0.0, 0.0), (5.0, 2.0)]
    pairs += [(-7.0, -2.0)]
    for action, torque in pairs:
        observ, reward, *_ = wrapped.step(np.array([action], np.float32))
        observ_raw, reward_raw, *_ = raw.step(np.array([torque], np.float32))
        np.testing.assert_allclose(observ, observ_raw, rtol=1e-6)
        assert reward == pytest.approx(reward_raw, rel=1e-6)
        assert observ.dtype == np.float32


class Float64Env(gymnasium.Env):
    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = spaces.Box(-2.0, 2.0, (1,), np.float64)

    def reset(self, *, seed=None, options=None):
        return np.full(3, 0.1, np.float64), {}

    def step(self, action):
        return np.full(3, action[0], np.float64), 0.0, False, False, {}


def test_standard_wrappers_convert_observations_to_float32():
    wrapped = standard_wrappers(Float64Env())
    assert wrapped.observation_space == spaces.Box(-np.inf, np.inf, (3,), np.float32)
    assert wrapped.action_space == spaces.Box(-1.0, 1.0, (1,), np.float64)
    observ, _ = wrapped.reset(seed=0)
    assert observ.dtype == np.float32 and observ.shape == (3,)
    observ = wrapped.step(np.array([1.0]))[0]
    assert observ.dtype == np.float32
    np.testing.assert_array_equal(observ, [2.0, 2.0, 2.0])


def test_standard_wrappers_leave_discrete_actions_untouched():
    env = gymnasium.make("CartPole-v1")
    wrapped = standard_wrappers(env)
    assert wrapped is env  # Nothing to do for CartPole: float32 Box observations.
    assert wrapped.action_space == spaces.Discrete(2)
    observ, *_ = wrapped.reset(seed=0)
    assert observ.dtype == np.float32
    wrapped.step(1)


def test_standard_wrappers_time_limit():
    # No time limit yet: one is added.
    env = standard_wrappers(PendulumEnv(), max_episode_steps=5)
    env.reset(seed=0)
    truncated = [env.step(np.zeros(1, np.float32))[3] for _ in range(5)]
    assert truncated == [False] * 4 + [True]
    # The same limit as the environment's: nothing added.
    env = gymnasium.make("CartPole-v1")
    assert standard_wrappers(env, max_episode_steps=500) is env
    # A different limit replaces the outermost TimeLimit, also a longer one.
    env = standard_wrappers(gymnasium.make("CartPole-v1"), max_episode_steps=600)
    assert env.spec.max_episode_steps == 600
    limits = []
    inner = env
    while isinstance(inner, gymnasium.Wrapper):
        if isinstance(inner, gymnasium.wrappers.TimeLimit):
            limits.append(inner._max_episode_steps)
        inner = inner.env
    assert limits == [600]
    env = standard_wrappers(gymnasium.make("Pendulum-v1"), max_episode_steps=3)
    env.reset(seed=0)
    assert [env.step(np.zeros(1, np.float32))[3] for _ in range(3)] == [False, False, True]
    # A deeper, shorter limit cannot be lifted.
    env = gymnasium.wrappers.RecordEpisodeStatistics(
        gymnasium.wrappers.TimeLimit(PendulumEnv(), 10)
    )
    with pytest.raises(ValueError, match="time limit of 10 steps"):
        standard_wrappers(env, max_episode_steps=20)
    with pytest.raises(ValueError, match="max_episode_steps"):
        standard_wrappers(PendulumEnv(), max_episode_steps=0)


class SpacesEnv(gymnasium.Env):
    def __init__(self, observation_space, action_space):
        self.observation_space = observation_space
        self.action_space = action_space


def test_standard_wrappers_reject_unsupported_spaces():
    box = spaces.Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(ValueError, match=r"observation space Dict.*observation\['t'\] is Text"):
        standard_wrappers(SpacesEnv(spaces.Dict({"a": box, "t": spaces.Text(3)}), box))
    with pytest.raises(ValueError, match="observation space Text"):
        standard_wrappers(SpacesEnv(spaces.Text(3), box))
    with pytest.raises(ValueError, match=r"action space Graph"):
        standard_wrappers(SpacesEnv(box, spaces.Graph(box, None)))


def test_standard_wrappers_keep_unbounded_box_actions():
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    env = SpacesEnv(spaces.Box(-1.0, 1.0, (2,), np.float32), unbounded)
    assert standard_wrappers(env) is env


class _RecordingEnv(gymnasium.Env):
    """Records the action it receives; action bounds given at construction."""

    def __init__(self, low, high):
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float64)
        self.action_space = gymnasium.spaces.Box(
            np.array(low, np.float32), np.array(high, np.float32), dtype=np.float32)
        self.received = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2), {}

    def step(self, action):
        self.received = np.array(action)
        return np.zeros(2), 0.0, False, False, {}


_bounds = st.lists(
    st.tuples(st.floats(-100, 100, width=32), st.floats(0.015625, 100, width=32)),
    min_size=1, max_size=3)


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(bounds=_bounds, data=st.data())
def test_standard_wrappers_map_unit_actions_onto_any_bounds(bounds, data):
    low = [lo for lo, _ in bounds]
    high = [lo + width for lo, width in bounds]
    raw = _RecordingEnv(low, high)
    env = standard_wrappers(raw)
    action = np.array(data.draw(st.lists(st.floats(-3, 3, width=32), min_size=len(bounds),
                                         max_size=len(bounds))), np.float32)
    env.reset(seed=0)
    observ, *_ = env.step(action)
    clipped = np.clip(action, -1.0, 1.0)
    expected = np.array(low) + (clipped + 1.0) / 2.0 * (np.array(high) - np.array(low))
    np.testing.assert_allclose(raw.received, expected, rtol=1e-4, atol=1e-3)
    assert observ.dtype == np.float32
    assert env.action_space == gymnasium.spaces.Box(-1.0, 1.0, (len(bounds),), np.float32)

"""Tests of batchrl.environments.processes.ParallelBatchEnv."""

import functools
import glob
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import cloudpickle
import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.environments.processes import ParallelBatchEnv
from batchrl.environments.wrappers import WorkerError, standard_wrappers

# Environments defined here are sent to workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class EchoEnv(gymnasium.Env):
    """Seeded random observations and rewards that depend on the actions; episodes of
    random length (1 to 11 steps) that end terminated or truncated."""

    def __init__(self, observ_shape=(3,), actions=(2,)):
        self.observation_space = spaces.Box(-np.inf, np.inf, observ_shape, np.float32)
        if isinstance(actions, int):
            self.action_space = spaces.Discrete(actions)
        else:
            self.action_space = spaces.Box(-1.0, 1.0, actions, np.float32)
        self.seed = None
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.seed = seed
        self._left = int(self.np_random.integers(1, 12))
        self._truncate = bool(self.np_random.integers(2))
        return self._observ(0.0), {"reset": True}

    def step(self, action):
        assert self.action_space.contains(action), repr(action)
        self.count += 1
        value = float(np.sum(action))
        self._left -= 1
        done = self._left <= 0
        reward = value * 0.5 + float(self.np_random.uniform())
        return (self._observ(value), reward, done and not self._truncate,
                done and self._truncate, {"value": value})

    def _observ(self, value):
        shape = self.observation_space.shape
        return (self.np_random.uniform(-1.0, 1.0, shape) + value).astype(np.float32)


class FaultEnv(EchoEnv):
    """An `EchoEnv` that misbehaves (`fault`) at its step number `at_step` (or in `reset`),
    only when it was last reset with seed `target_seed` (env `i` after `reset(seed=0)`)."""

    def __init__(self, fault, target_seed, at_step=3):
        super().__init__((3,), (1,))
        self.fault = fault
        self.target_seed = target_seed
        self.at_step = at_step

    def reset(self, *, seed=None, options=None):
        if self.fault == "raise_reset" and seed == self.target_seed:
            raise RuntimeError(f"reset-failed-{seed}")
        if self.fault == "bad_reset_shape" and seed == self.target_seed:
            return np.zeros(4, np.float32), {}
        return super().reset(seed=seed, options=options)

    def step(self, action):
        result = list(super().step(action))
        if self.seed != self.target_seed or self.count != self.at_step:
            return tuple(result)
        if self.fault == "raise_step":
            raise RuntimeError(f"step-failed-{self.seed}")
        if self.fault == "nan_observ":
            result[0][1] = np.nan
        elif self.fault == "inf_reward":
            result[1] = float("inf")
        elif self.fault == "bad_shape":
            result[0] = np.zeros((5,), np.float32)
        elif self.fault == "exit":
            os._exit(3)
        elif self.fault == "hang":
            time.sleep(60)
        return tuple(result)


_calls = {"count": 0}


def fail_on_call(number):
    """Constructor failing at its `number`-th call in a process."""
    _calls["count"] += 1
    if _calls["count"] == number:
        raise RuntimeError("constructor-failed-13")
    return EchoEnv()


_first_process = {}


def first_process_differs(marker, which):
    """Constructor whose environments differ (observation or action space) in every process
    but the first one to call it."""
    if "first" not in _first_process:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            _first_process["first"] = True
        except FileExistsError:
            _first_process["first"] = False
    if _first_process["first"]:
        return EchoEnv()
    return EchoEnv((4,), (2,)) if which == "observation" else EchoEnv((3,), (3,))


def tensorflow_sized_env():
    """An `EchoEnv` whose observation has 4 entries when TensorFlow is loaded, else 3."""
    return EchoEnv((4,) if "tensorflow" in sys.modules else (3,), (2,))


def make_pendulum():
    return standard_wrappers(gymnasium.make("Pendulum-v1"))


def running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def segments():
    """Shared memory segments of ParallelBatchEnvs of this process."""
    return glob.glob(f"/dev/shm/batchrl-{os.getpid()}-*")


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every test leaves no shared memory segment and no FIFO directory behind."""
    yield
    assert segments() == []
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"batchrl-fifos-{os.getpid()}-*")) == []


def assert_workers_gone(pids, within=5.0):
    deadline = time.monotonic() + within
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(running(pid) for pid in pids), [pid for pid in pids if running(pid)]


def random_actions(space, batch, rng):
    if isinstance(space, spaces.Discrete):
        return rng.integers(0, space.n, batch)
    return rng.uniform(-1.0, 1.0, (batch, *space.shape)).astype(np.float32)


def assert_same_step(result, expected, batch, observ_shape):
    observ, reward, terminated, truncated, infos = result
    assert observ.dtype == np.float32 and observ.shape == (batch, *observ_shape)
    assert reward.dtype == np.float32 and reward.shape == (batch,)
    assert terminated.dtype == bool and truncated.dtype == bool
    assert infos == tuple({} for _ in range(batch))
    for got, want in zip(result[:4], expected[:4], strict=True):
        np.testing.assert_array_equal(got, want)


# Equivalence with an in-process BatchEnv.


@pytest.mark.parametrize("constructor, num_envs, num_workers, groups", [
    (functools.partial(EchoEnv, (3,), (2,)), 5, 1, [5]),
    (functools.partial(EchoEnv, (2, 4), (1,)), 7, 3, [3, 2, 2]),
    (functools.partial(EchoEnv, (), 3), 4, 2, [2, 2]),
    (functools.partial(EchoEnv, (4,), 5), 3, 5, [1, 1, 1]),
    (functools.partial(MockEnvironment, (2, 3), (2,), 2, 6, True), 6, 4, [2, 2, 1, 1]),
    (make_pendulum, 5, 2, [3, 2]),
])
def test_matches_batch_env(constructor, num_envs, num_workers, groups):
    rng = np.random.default_rng(7)
    reference = BatchEnv([constructor() for _ in range(num_envs)], blocking=True)
    with ParallelBatchEnv(constructor, num_envs, num_workers=num_workers) as batch:
        assert len(batch) == num_envs and not batch.blocking
        assert [len(group) for group in batch.groups] == groups
        assert batch.num_workers == len(groups) == len(set(batch.worker_pids))
        assert batch.observation_space == reference.observation_space
        assert batch.action_space == reference.action_space
        shape = batch.observation_space.shape
        observ, infos = batch.reset(seed=11)
        np.testing.assert_array_equal(observ, reference.reset(seed=11)[0])
        assert observ.dtype == np.float32 and infos == tuple({} for _ in range(num_envs))
        kept = []
        for step in range(60):
            actions = random_actions(batch.action_space, num_envs, rng)
            result = batch.step(actions)
            assert_same_step(result, reference.step(actions), num_envs, shape)
            kept.append((result[0].copy(), result[0]))
            done = result[2] | result[3]
            if step % 7 == 3:  # Also a random subset, in random order, with seeds.
                done |= rng.random(num_envs) < 0.3
            indices = rng.permutation(np.flatnonzero(done))
            seed = int(rng.integers(100)) if step % 2 else None
            observ, infos = batch.reset(indices, seed=seed)
            np.testing.assert_array_equal(observ, reference.reset(indices, seed=seed)[0])
            assert observ.shape == (len(indices), *shape)
            assert infos == tuple({} for _ in indices)
        for copy, returned in kept:  # Returned arrays are the caller's.
            np.testing.assert_array_equal(copy, returned)


def test_half_cheetah_matches_batch_env():
    from batchrl import environments

    constructor = functools.partial(environments.create, "HalfCheetah-v5", 1000)
    rng = np.random.default_rng(0)
    with (BatchEnv([constructor() for _ in range(3)], blocking=True) as reference,
          ParallelBatchEnv(constructor, 3, num_workers=2, name="HalfCheetah-v5") as batch):
        np.testing.assert_array_equal(batch.reset(seed=5)[0], reference.reset(seed=5)[0])
        for _ in range(20):
            actions = random_actions(batch.action_space, 3, rng)
            assert_same_step(batch.step(actions), reference.step(actions), 3, (17,))


def test_default_workers_and_partial_reset():
    constructor = functools.partial(EchoEnv, (3,), (2,))
    with ParallelBatchEnv(constructor, 64) as batch:
        assert batch.num_workers == min(os.cpu_count(), 64)
    with ParallelBatchEnv(constructor, 4, num_workers=2) as batch:
        full, _ = batch.reset(seed=0)
        again, _ = batch.reset([3, 1], seed=0)  # Env i gets seed 0 + i.
        np.testing.assert_array_equal(again, full[[3, 1]])
        empty, infos = batch.reset([])
        assert empty.shape == (0, 3) and empty.dtype == np.float32 and infos == ()
        with pytest.raises(IndexError, match="batch index 4 out of range"):
            batch.reset([0, 4])
        with pytest.raises(IndexError, match="batch index -1 out of range"):
            batch.reset([-1])
        with pytest.raises(ValueError, match="batch index 2 appears more than once"):
            batch.reset([2, 0, 2])
        batch.step(np.zeros((4, 2), np.float32))  # Still usable after the caller's errors.


def test_workers_do_not_import_tensorflow():
    with ParallelBatchEnv(tensorflow_sized_env, 2, num_workers=2) as batch:
        assert batch.observation_space.shape == (3,)


def test_invalid_arguments():
    constructor = functools.partial(EchoEnv, (3,), (2,))
    for num_envs in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_envs must be a positive int"):
            ParallelBatchEnv(constructor, num_envs)
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        ParallelBatchEnv(constructor, 2, num_workers=0)
    with pytest.raises(ValueError, match="timeout must be positive"):
        ParallelBatchEnv(constructor, 2, timeout=0)


# Errors.


def test_wrong_actions_keep_the_batch_usable():
    with ParallelBatchEnv(functools.partial(EchoEnv, (3,), (2,)), 3, num_workers=2) as batch:
        batch.reset(seed=0)
        with pytest.raises(ValueError, match=r"expected actions of shape \(3, 2\).*"
                                             r"got shape \(3, 1\)"):
            batch.step(np.zeros((3, 1), np.float32))
        with pytest.raises(ValueError, match=r"got shape \(2, 2\)"):
            batch.step(np.zeros((2, 2), np.float32))
        batch.step(np.zeros((3, 2)))  # float64 actions are converted.
    with ParallelBatchEnv(functools.partial(EchoEnv, (3,), 4), 3, num_workers=2) as batch:
        batch.reset(seed=0)
        with pytest.raises(ValueError, match=r"expected actions of shape \(3,\)"):
            batch.step(np.zeros((3, 1), np.int64))
        with pytest.raises(ValueError, match="convertible to int64.*got dtype float64"):
            batch.step(np.zeros(3))
        batch.step(np.array([0, 3, 1], np.int32))


def test_constructor_error_names_the_env():
    with pytest.raises(WorkerError) as caught:
        ParallelBatchEnv(functools.partial(fail_on_call, 4), 7, num_workers=2, name="Probe")
    message = str(caught.value)
    assert message.startswith("env 3 (Probe): the constructor raised in the worker process")
    assert "Traceback" in message and "constructor-failed-13" in message


@pytest.mark.parametrize("which", ["observation", "action"])
def test_spaces_must_match_across_workers(tmp_path, which):
    constructor = functools.partial(first_process_differs, str(tmp_path / "marker"), which)
    with pytest.raises(ValueError, match=rf"{which} space of env 2 \(Box.*\) differs from "
                                         r"that of env 0 \(Box.*\)"):
        ParallelBatchEnv(constructor, 4, num_workers=2)


@pytest.mark.parametrize("fault, error, pattern", [
    ("raise_step", WorkerError,
     r"^env 4 \(FaultEnv\): step\(\) raised in the worker process \(pid \d+\):\n"
     r"Traceback(.|\n)*RuntimeError: step-failed-4"),
    ("raise_reset", WorkerError,
     r"^env 4 \(FaultEnv\): reset\(\) raised in the worker process \(pid \d+\):\n"
     r"Traceback(.|\n)*RuntimeError: reset-failed-4"),
    ("nan_observ", ValueError, r"^env 4 returned a non-finite observation: array\(\[.*nan"),
    ("inf_reward", ValueError, r"^env 4 returned a non-finite reward: inf"),
    ("bad_shape", ValueError,
     r"^env 4 returned an observation of shape \(5,\), expected \(3,\): array"),
    ("bad_reset_shape", ValueError,
     r"^env 4 returned an observation of shape \(4,\), expected \(3,\)"),
    ("exit", WorkerError,
     r"^envs 3-5 \(FaultEnv\(.*\)\): the worker process \(pid \d+\) died with exit code 3"),
])
def test_environment_failures_close_the_batch(fault, error, pattern):
    batch = ParallelBatchEnv(functools.partial(FaultEnv, fault, 4), 6, num_workers=2)
    pids = batch.worker_pids
    with pytest.raises(error, match=pattern):
        batch.reset(seed=0)
        for _ in range(5):
            batch.step(np.zeros((6, 1), np.float32))
    assert_workers_gone(pids)
    assert segments() == []
    with pytest.raises(WorkerError, match="the batch was closed after an error"):
        batch.step(np.zeros((6, 1), np.float32))
    batch.close()


def test_killed_worker_is_reported_quickly():
    batch = ParallelBatchEnv(functools.partial(EchoEnv, (3,), (2,)), 5, num_workers=3,
                             timeout=60.0, name="Echo")
    pids = batch.worker_pids
    batch.reset(seed=0)
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"^envs 2-3 \(Echo\): the worker process "
                                          rf"\(pid {pids[1]}\) died from signal SIGKILL"):
        batch.step(np.zeros((5, 2), np.float32))
    # Reported when the channel breaks, not after the 60 s timeout (bound far below it, so
    # that a loaded machine does not fail the test).
    assert time.monotonic() - start < 20.0
    assert_workers_gone(pids)
    batch.close()
    batch.close()


def test_hung_worker_times_out():
    batch = ParallelBatchEnv(functools.partial(FaultEnv, "hang", 1, at_step=1), 3,
                             num_workers=2, timeout=1.0)
    pids = batch.worker_pids
    batch.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"^envs 0-1 \(.*\): the worker process \(pid \d+\) "
                                          r"did not answer within 1 s and was killed"):
        batch.step(np.zeros((3, 1), np.float32))
    assert 0.9 < time.monotonic() - start < 20.0  # The hang lasts 60 s.
    assert_workers_gone(pids)


def test_close_is_idempotent_and_final():
    batch = ParallelBatchEnv(functools.partial(EchoEnv, (3,), (2,)), 4, num_workers=2)
    pids = batch.worker_pids
    assert all(running(pid) for pid in pids) and len(segments()) == 1
    batch.close()
    assert_workers_gone(pids, within=0.0)
    assert segments() == []
    batch.close()
    with pytest.raises(WorkerError, match="the batch is closed"):
        batch.step(np.zeros((4, 2), np.float32))
    with pytest.raises(WorkerError, match="the batch is closed"):
        batch.reset()


def test_garbage_collection_ends_the_workers():
    batch = ParallelBatchEnv(functools.partial(EchoEnv, (3,), (2,)), 4, num_workers=2)
    pids = batch.worker_pids
    batch.reset(seed=0)
    del batch
    assert_workers_gone(pids, within=2.0)
    assert segments() == []


_SCRIPT = textwrap.dedent("""
    import functools, os, signal, sys
    import numpy as np
    from batchrl.environments.mock import MockEnvironment
    from batchrl.environments.processes import ParallelBatchEnv
    from batchrl.environments.wrappers import WorkerError

    constructor = functools.partial(MockEnvironment, (3,), (1,), 5, 10)
    first = ParallelBatchEnv(constructor, 4, num_workers=2)
    first.reset(seed=0)
    os.kill(first.worker_pids[1], signal.SIGKILL)
    try:
        first.step(np.zeros((4, 1), np.float32))
    except WorkerError:
        pass
    second = ParallelBatchEnv(constructor, 4, num_workers=2)  # Left open.
    second.reset(seed=0)
    second.step(np.zeros((4, 1), np.float32))
    print(os.getpid(), *first.worker_pids, *second.worker_pids, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_no_leak_and_no_tracker_warning_at_exit(end):
    """Nothing is left behind when the parent exits without closing the batch, or is killed.
    At a normal exit the resource tracker prints nothing (it would warn about a "leaked
    shared_memory" object had a worker registered the segment); when the parent is killed,
    the tracker unlinks the segment."""
    start = time.monotonic()
    process = subprocess.run([sys.executable, "-c", _SCRIPT, end], capture_output=True,
                             text=True, timeout=60)
    # No worker waited for in vain at exit (that would take the 60 s timeout).
    assert time.monotonic() - start < 30.0
    assert process.returncode == (0 if end == "exit" else -signal.SIGKILL), process.stderr
    parent, *pids = [int(pid) for pid in process.stdout.split()]
    assert len(pids) == 4
    assert_workers_gone(pids)
    deadline = time.monotonic() + 10.0
    while glob.glob(f"/dev/shm/batchrl-{parent}-*") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert glob.glob(f"/dev/shm/batchrl-{parent}-*") == []
    if end == "exit":
        assert process.stderr == ""


def test_configs_build_a_parallel_batch_env_seeded_like_the_in_process_batch():
    from batchrl import configs, environments
    settings = {"env": "Pendulum-v1", "num_agents": 5, "seed": 3}
    in_process = environments.create_batch(
        configs.load("pendulum", {**settings, "env_backend": "local"}))
    with environments.create_batch(configs.load(
            "pendulum", {**settings, "env_backend": "processes", "num_workers": 2})) as parallel:
        assert isinstance(parallel, ParallelBatchEnv) and parallel.num_workers == 2
        assert parallel.groups == (range(0, 3), range(3, 5))
        actions = np.random.default_rng(0).uniform(-1, 1, (10, 5, 1)).astype(np.float32)
        observ = in_process.reset(seed=3)[0]
        np.testing.assert_array_equal(parallel.reset(seed=3)[0], observ)
        for action in actions:
            expected, got = in_process.step(action), parallel.step(action)
            for index in range(4):
                np.testing.assert_array_equal(got[index], expected[index])
    in_process.close()

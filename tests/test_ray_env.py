"""The Ray backend on a two-node Ray cluster of this machine: actors on both nodes, faults
named like `ParallelBatchEnv`'s, restarts."""

import functools
import logging
import os
import pathlib
import signal
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from batchrl import environments
from batchrl.tools import ray_env
from batchrl.tools.parallel_batch_env import ParallelBatchEnv
from batchrl.tools.wrappers import WorkerError

pytest.importorskip("ray")  # The extra batchrl[ray].

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # The cluster's processes have it on PYTHONPATH.
PENDULUM = functools.partial(environments.create, "Pendulum-v1", None)
FAULTY = "fault_envs:FaultyPendulum"  # scripts/fault_envs.py, on the cluster's PYTHONPATH.


def faulty(fault, after):
    return functools.partial(environments.create, FAULTY, None,
                             kwargs={"fault": fault, "after": after})


def wait_gone(pids):
    """Waits (up to a minute) until none of `pids` exists; returns those still there."""
    deadline = time.monotonic() + 60
    while True:
        alive = [pid for pid in pids if _exists(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # A zombie has exited.
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_actors_on_both_nodes_step_like_parallel_batch_env(ray_cluster):
    actions = np.random.default_rng(0).uniform(-1, 1, (5, 4, 1))
    with ray_env.RayBatchEnv(PENDULUM, 4, num_workers=2, name="Pendulum-v1") as batch_env, \
            ParallelBatchEnv(PENDULUM, 4, num_workers=2) as reference:
        assert len(set(batch_env.worker_nodes)) == 2  # One actor on each node.
        assert batch_env.groups == (range(0, 2), range(2, 4))
        assert batch_env.interrupted is None  # No restarts: nothing is ever cut short.
        np.testing.assert_array_equal(batch_env.reset(seed=5)[0], reference.reset(seed=5)[0])
        for action in actions:
            for got, expected in zip(batch_env.step(action)[:4], reference.step(action)[:4],
                                     strict=True):
                np.testing.assert_array_equal(got, expected)
        pids = batch_env.worker_pids
    assert wait_gone(pids) == []


def test_environment_exception_names_the_env_and_closes_the_batch(ray_cluster):
    batch_env = ray_env.RayBatchEnv(faulty("raise", 2), 4, num_workers=2, restarts=1)
    pids = batch_env.worker_pids
    batch_env.reset(seed=0)
    batch_env.step(np.zeros((4, 1)))
    with pytest.raises(WorkerError, match=r"(?s)^env 0 \(Pendulum-v1\): step\(\) raised in the "
                                          r"Ray actor \(pid \d+ on node [\d.]+\):\n.*"
                                          r"injected fault after 2 steps"):
        batch_env.step(np.zeros((4, 1)))
    assert wait_gone(pids) == []  # An environment's error is not restarted.
    with pytest.raises(WorkerError, match="the batch was closed after an error: env 0"):
        batch_env.step(np.zeros((4, 1)))
    batch_env.close()


def test_killed_actor_is_named_and_restarted_while_restarts_last(ray_cluster, caplog):
    batch_env = ray_env.RayBatchEnv(PENDULUM, 4, num_workers=2, restarts=1)
    batch_env.reset(seed=3)
    batch_env.step(np.zeros((4, 1)))
    os.kill(batch_env.worker_pids[1], signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="batchrl.tools.ray_env"):
        observ, reward, terminated, truncated, _ = batch_env.step(np.zeros((4, 1)))
    assert "envs 2-3 (Pendulum-v1): the Ray actor" in caplog.text
    assert "restart 1 of 1" in caplog.text
    assert batch_env.restarts == (0, 1)
    np.testing.assert_array_equal(batch_env.interrupted, [False, False, True, True])
    np.testing.assert_array_equal(truncated, [False, False, True, True])
    assert not terminated.any() and (reward[2:] == 0).all() and (reward[:2] != 0).all()
    # Envs 2 and 3 begin new episodes from seed 3 + index + 4 (the batch's first restart).
    for index in (2, 3):
        fresh, _ = gym.make("Pendulum-v1").reset(seed=3 + index + 4)
        np.testing.assert_allclose(observ[index], fresh)
    batch_env.step(np.zeros((4, 1)))
    assert not batch_env.interrupted.any()
    pid = batch_env.worker_pids[1]
    pids = batch_env.worker_pids
    os.kill(pid, signal.SIGKILL)  # No restart left.
    with pytest.raises(WorkerError, match=rf"^envs 2-3 \(Pendulum-v1\): the Ray actor \(pid "
                                          rf"{pid} on node [\d.]+\) died: its worker process "
                                          rf"exited"):
        batch_env.step(np.zeros((4, 1)))
    assert wait_gone(pids) == []
    batch_env.close()


def test_hung_actor_is_killed_after_the_timeout(ray_cluster):
    batch_env = ray_env.RayBatchEnv(faulty("hang", 1), 2, num_workers=2, timeout=2.0)
    pids = batch_env.worker_pids
    batch_env.reset(seed=0)
    with pytest.raises(WorkerError, match=r"^env 0 \(Pendulum-v1\): the Ray actor \(pid \d+ "
                                          r"on node [\d.]+\) did not answer within 2 s and "
                                          r"was killed"):
        batch_env.step(np.zeros((2, 1)))
    assert wait_gone(pids) == []

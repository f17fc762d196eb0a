"""The Ray backend (`env_backend: ray`) on a two-node Ray cluster of this machine: actors on
both nodes, faults named like `ParallelBatchEnv`'s, restarts, training runs with an actor
killed mid-run, a local Ray that `train` starts and stops, and one whose driver is killed
with SIGKILL."""

import functools
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs, environments
from batchrl.drivers.loop import EnvironmentFailed
from batchrl.environments.processes import ParallelBatchEnv
from batchrl.environments.ray import driver as ray_env
from batchrl.environments.wrappers import WorkerError
from batchrl.scripts import train
from benchmarks.faults import evidence

pytest.importorskip("ray")  # The extra batchrl[ray].

ROOT = pathlib.Path(__file__).resolve().parents[2]
PENDULUM = functools.partial(environments.create, "Pendulum-v1", None)
# benchmarks/faults/envs.py; the cluster's processes have the repository on PYTHONPATH.
FAULTY = "benchmarks.faults.envs:FaultyPendulum"


def faulty(fault, after):
    return functools.partial(environments.create, FAULTY, None,
                             kwargs={"fault": fault, "after": after})


def wait_gone(pids, seconds=60):
    """Waits (up to `seconds`) until none of `pids` exists; returns those still there."""
    deadline = time.monotonic() + seconds
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
    with caplog.at_level(logging.WARNING, logger="batchrl.environments.ray.driver"):
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


def _config(tmp_path, **overrides):
    """Two phases of training and eval, episodes of 20 steps; an actor is killed at the
    15th step of one of its environments, in the first training phase."""
    settings = {"env": FAULTY, "env_backend": "ray", "num_agents": 4, "num_workers": 2,
                "steps": 160, "eval_every": 80, "log_every": 40, "eval_episodes": 4,
                "update_every": 4, "update_epochs": 2, "worker_timeout": 30.0, "max_length": 20,
                "env_kwargs": {"fault": "kill", "after": 15,
                               "once": str(tmp_path / "killed")}}
    return configs.load("pendulum", {**settings, **overrides})


def test_training_goes_on_after_a_killed_actor_is_restarted(ray_cluster, tmp_path, caplog):
    """The pendulum config with `env_backend: ray` (its `env_backend: local` replaced;
    nothing else about Ray needs to change: Ray is the cluster this process is connected
    to), an actor killed mid-run."""
    config = _config(tmp_path, worker_restarts=1)
    with caplog.at_level(logging.WARNING, logger="batchrl.environments.ray.driver"):
        _, results = train.train(config, tmp_path / "run", progress=False)
    assert (tmp_path / "killed").exists()  # The fault happened.
    assert caplog.text.count("restarted it as a new Ray actor") == 1
    assert [result.name for result in results] == ["train", "eval", "train", "eval"]
    scores = [score for result in results for score in result.scores]
    assert scores and np.isfinite(scores).all()
    assert (tmp_path / "run" / "ckpt-160.index").exists()


def test_killed_actor_without_restarts_ends_training_with_the_error(ray_cluster, tmp_path):
    config = _config(tmp_path, worker_restarts=0)
    with pytest.raises(EnvironmentFailed, match=r"^at step [\d,]+: envs [02]-[13] "
                                                r"\(benchmarks\.faults\.envs:FaultyPendulum\): "
                                                r"the Ray actor \(pid \d+ on node [\d.]+\) "
                                                r"died"):
        train.train(config, tmp_path / "run", progress=False)


def test_sac_trains_on_ray_actors(ray_cluster, tmp_path, capsys):
    """An off-policy algorithm on Ray, through the command: `--config=pendulum_sac --set
    env_backend=ray` (the update without XLA, episodes of 20 steps); the transitions of the
    actors' environments fill the replay memory and the updates run."""
    logdir = tmp_path / "run"
    assert train.main(["--config=pendulum_sac", f"--logdir={logdir}", "--no-progress",
                       "--set", "env_backend=ray", "--set", "num_agents=4",
                       "--set", "num_workers=2", "--set", "steps=200",
                       "--set", "eval_every=200", "--set", "eval_episodes=2",
                       "--set", "max_length=20", "--set", "jit_update=false",
                       "--set", "learning_starts=100"]) == 0, capsys.readouterr().err
    assert "Final eval mean_score" in capsys.readouterr().out
    reader = tf.train.load_checkpoint(str(logdir / "ckpt-200"))
    updates = [name for name in reader.get_variable_to_shape_map()
               if name.startswith("updates/")]
    # One update per transition from the batch step that brings the memory to 100 (the
    # 25th of 4 agents) on: 200 - 24 * 4.
    assert int(reader.get_tensor(updates[0])) == 200 - 96
    saved = configs.read_run_config(logdir / "config.yaml")
    assert saved.env == "Pendulum-v1" and saved.env_backend == "ray"


def test_backend_keys_that_contradict_are_one_line_errors():
    for overrides, message in [
            ({"env_backend": "ray", "env": "batchrl.native_tasks:Pendulum"},
             "env 'batchrl.native_tasks:Pendulum' is an in-graph environment, stepped in the "
             "graph: choose env_backend local or processes"),
            ({"env_backend": "envpool", "env": "batchrl.native_tasks:Pendulum"},
             "env 'batchrl.native_tasks:Pendulum' is not an EnvPool task id"),
            ({"worker_restarts": 1},
             "'worker_restarts' (1) applies only to env_backend: ray or actors, and "
             "env_backend is local"),
            ({"env_backend": "envpool", "worker_cpus": 2.0},
             "'worker_cpus' (2.0) applies only to env_backend: ray, and env_backend is envpool"),
            ({"ray_address": "auto"}, "'ray_address' ('auto') applies only to env_backend")]:
        config = configs.load("pendulum", overrides)
        with pytest.raises(configs.ConfigError, match=message.replace("(", r"\(").replace(
                ")", r"\)")):
            environments.check_backend(config)


def _leftovers(marker):
    return evidence.marked_processes(marker, "BATCHRL_RAY_TEST")


def test_train_stops_the_local_ray_it_started_on_sigterm_and_unreachable_is_one_line(
        tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", BATCHRL_RAY_TEST=str(os.getpid()))
    command = [sys.executable, "-m", "batchrl.scripts.train", "--config=pendulum",
               "--set", "env_backend=ray", "--set", "num_agents=4", "--set", "num_workers=2",
               "--set", "eval_every=80", "--set", "eval_episodes=2", "--set", "max_length=20",
               "--set", "update_every=4", "--set", "update_epochs=2", "--no-progress"]
    result = subprocess.run([*command, f"--logdir={tmp_path / 'unreachable'}", "--set",
                             "ray_address=127.0.0.1:1"], capture_output=True, text=True,
                            env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: config key 'ray_address' ('127.0.0.1:1'): cannot join the Ray cluster at "
        "'127.0.0.1:1': nothing answers there (Connection refused)")
    assert not (tmp_path / "unreachable").exists()  # Nothing written.
    process = subprocess.Popen([*command, f"--logdir={tmp_path / 'run'}"], env=env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:  # Wait until training runs (after an eval).
        if line.startswith("step"):
            break
    assert len(_leftovers(os.getpid())) > 3  # The trainer and Ray's processes.
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "Stopped at step" in stderr
    assert wait_gone(_leftovers(os.getpid())) == []


def _tree(root):
    """{pid: name} of the processes under `root` (its children, theirs, ...), from
    /proc/PID/stat (name: field 2, parent: field 4)."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # It ended meanwhile.
            continue
        name, _, fields = stat.partition(" (")[2].rpartition(")")
        parents[int(entry.name)] = (int(fields.split()[1]), name)
    tree, level = {}, {root}
    while level:
        level = {pid for pid, (parent, _) in parents.items() if parent in level}
        tree.update((pid, parents[pid][1]) for pid in level)
    return tree


def test_a_driver_killed_with_sigkill_leaves_no_ray_process():
    """`connection.connect(None)` starts a local Ray whose raylet starts a dashboard agent and
    a runtime-env agent (Ray 2.60 has no option against them) and no idle worker ahead of
    need (`connection.LOCAL_SYSTEM_CONFIG`; Ray's default starts one per CPU as the driver
    connects, seen here a second later). When the driver is killed with
    SIGKILL, Ray's other processes end with it, but the agents wait 60 s (a fixed timeout of
    Ray's) before they exit; the reaper that `connect` starts kills them at once. Waiting
    half those 60 s tells one from the other (docs/faults.md, "SIGKILL of a trainer with Ray
    actors": 0.1-2.7 s with the reaper)."""
    code = ("import time\n"
            "from batchrl.environments.ray import connection\n"
            "connection.connect(None)\n"
            "print('connected', flush=True)\n"
            "time.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        assert process.stdout.readline() == "connected\n"
        time.sleep(1.0)
        tree = _tree(process.pid)
        raylet = [pid for pid, name in tree.items() if name == "raylet"]
        under_raylet = sorted(_tree(raylet[0]).values()) if raylet else None
    finally:
        process.kill()
        process.wait()
    names = sorted(tree.values())
    assert {"raylet", "gcs_server", "ray::DashboardA", "ray::RuntimeEnv"} <= set(names), names
    assert under_raylet == ["ray::DashboardA", "ray::RuntimeEnv"], names
    assert wait_gone(list(tree), seconds=30) == []

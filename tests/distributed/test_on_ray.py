"""The actors on Ray, on the two-node test cluster (one module: one cluster start). The
pool (`batchrl.distributed.pool.ActorPool`): bounded calls in flight, new weights picked
up, and the faults: an actor killed mid-run is replaced, an environment that raises or
hangs past the restarts is one error naming the actor, and nothing is left behind. The
command (`batchrl-train` with `actors`): Ctrl-C saves a checkpoint (with the policy
version) and leaves no actor behind, and the same command resumes."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.distributed.actor import FragmentActor
from batchrl.distributed.pool import ActorPool
from batchrl.environments.wrappers import WorkerError

pytest.importorskip("ray")
FAULTY = "benchmarks.faults.envs:FaultyPendulum"  # On the test cluster's PYTHONPATH.
ROOT = pathlib.Path(__file__).resolve().parents[2]
LENGTH = 5


def _config(**env_kwargs):
    return configs.load("default", {
        "algorithm": "impala", "env": FAULTY, "env_kwargs": env_kwargs, "actors": 1,
        "envs_per_actor": 1, "rollout_length": LENGTH, "policy_layers": [8],
        "value_layers": [8], "max_length": 200})


def _gone(pids, seconds=30):
    """Whether every process of `pids` ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def weights():
    """The policy's weights of an actor of `_config()` built in this process."""
    local = FragmentActor(_config(), 0)
    local.build()
    return local._actor.get_weights()


def test_a_killed_actor_is_replaced_and_new_weights_reach_every_actor(ray_cluster, tmp_path,
                                                                      weights):
    """Two actors, two calls each: never more than four fragments exist; the environment
    that reaches step 12 first kills its actor's process (once): its calls are discarded,
    a new actor takes its place, and fragments keep coming from both, acted by the version
    published after the restart. (How soon Ray reports the death depends on the load: the
    other actor's fragments keep coming meanwhile.)"""
    config = _config(fault="kill", after=12, once=str(tmp_path / "once"))
    pool = ActorPool(config, 2, 1.0, 2, 60.0, 1)
    try:
        pids = [int(pool.describe(k).rsplit(" ", 1)[1]) for k in range(2)]
        pool.publish(0, weights)
        first = [pool.next().version for _ in range(2)]
        newest = set()  # The actors whose fragments were acted by version 1.
        published = 0
        deadline = time.monotonic() + 120
        while len(newest) < 2 and time.monotonic() < deadline:
            taken = pool.next()
            assert len(pool._pending) <= 3  # Four in flight, less the one taken.
            assert taken.fragment["reward"].shape == (1, LENGTH)
            if sum(pool.restarts) and not published:
                published = 1
                pool.publish(published, weights)
            elif taken.version == 1:
                newest.add(taken.actor)
        assert first == [0, 0] and newest == {0, 1}
        assert pool.restarts in ([0, 1], [1, 0]) and pool.discarded >= 1
        new_pids = [int(pool.describe(k).rsplit(" ", 1)[1]) for k in range(2)]
        assert len(set(new_pids) - set(pids)) == 1
    finally:
        pool.close()
    assert _gone(new_pids + pids)


def test_a_call_acts_with_the_weights_newest_when_it_starts(ray_cluster, weights):
    """One actor, three calls in flight, each a fragment of about half a second (0.1 s a step):
    all three are queued while version 0 is the newest; version 1 is published while the
    second records, so the third, which starts after it, acts with version 1 (weights sent
    with each call when it is queued would act with version 0)."""
    config = configs.Config(_config(), env="benchmarks.slow_envs:SlowPendulum",
                            env_kwargs={"step_us": 100_000})
    pool = ActorPool(config, 1, 1.0, 3, 60.0, 0)
    try:
        pool.publish(0, weights)
        assert pool.next().version == 0
        pool.publish(1, [w + 1 for w in weights])
        pool.next()  # It started when the first ended: version 0, most likely.
        assert pool.next().version == 1
    finally:
        pool.close()


@pytest.mark.parametrize("fault, timeout, message", [
    ("raise", 60.0, r"failed: RuntimeError: injected fault after 7 steps"),
    ("hang", 4.0, r"did not finish a fragment within 4 s"),
])
def test_a_fault_past_the_restarts_is_one_error_naming_the_actor(ray_cluster, fault, timeout,
                                                                 message):
    pool = ActorPool(_config(fault=fault, after=7), 1, 1.0, 1, timeout, 0)
    where = pool.describe(0)
    try:
        with pytest.raises(WorkerError, match=rf"^actor 0 \({where}\) {message} "
                                              rf"\(worker_restarts: 0 used\)$"):
            for _ in range(3):
                pool.next()
    finally:
        pool.close()
    assert _gone([int(where.rsplit(" ", 1)[1])])


def _actor_processes(name="FragmentActor"):
    """The pids of Ray's actor processes of the class `name` (their title names it)."""
    pids = []
    for path in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if path.read_bytes().startswith(b"ray::" + name.encode()):
                pids.append(int(path.parent.name))
        except OSError:
            pass
    return pids


def _version(logdir):
    checkpoint = tf.train.Checkpoint(policy_version=tf.Variable(0, dtype=tf.int64))
    checkpoint.read(tf.train.latest_checkpoint(str(logdir))).expect_partial()
    return int(checkpoint.policy_version.numpy())


def _interrupt_at_first_step(command, actors, expected):
    """Starts the train `command`, checks at its first `step` line that `actors()` (a
    callable) counts `expected` actor processes, sends Ctrl-C (SIGINT), and returns its
    whole output once it stopped with the code of SIGINT and, within 30 s, no actor process
    was left."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step"):
            assert len(actors()) == expected, "".join(lines)
            process.send_signal(signal.SIGINT)
            break
    output = "".join(lines) + process.stdout.read()
    assert process.wait(timeout=120) == 128 + signal.SIGINT, output
    deadline = time.monotonic() + 30
    while actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not actors()
    return output


def test_ctrl_c_saves_the_policy_version_and_stops_the_actors_on_both_nodes(ray_cluster,
                                                                             tmp_path):
    """IMPALA's two actors spread over the two nodes; Ctrl-C at the first `step` line saves
    a checkpoint with the policy version and leaves no actor. (The same command resumes a
    run with actors: the Ape-X test below, with its replay memory.)"""
    logdir = tmp_path / "run"
    command = [sys.executable, "-m", "batchrl.scripts.train", "--config=cartpole_impala",
               f"--logdir={logdir}", "--no-progress", "--set", "actors=2", "--set",
               "envs_per_actor=4", "--set", "num_agents=2", "--set", "eval_episodes=2",
               "--set", "steps=3000", "--set", "eval_every=1000", "--set", "log_every=500",
               "--set", f"ray_address={ray_cluster.address}"]
    output = _interrupt_at_first_step(command, _actor_processes, 2)
    assert "Stopped at step" in output
    assert "Actors: 2 Ray actors of 4 environments each (8 in all) on 2 nodes." in output
    assert _version(logdir) > 0
    assert os.path.exists(logdir / "train")


def test_ape_x_replaces_a_killed_actor_and_keeps_its_replay_through_ctrl_c_and_resume(
        ray_cluster, tmp_path):
    """SAC in Ape-X mode with `save_replay: true` on `FaultyPendulum`, whose actor's
    environment kills its process at its 40th step (once): the actor is replaced
    (`worker_restarts: 1`) and training goes on; Ctrl-C at the first `step` line saves the
    learner and its replay memory and stops the actor; the same command resumes with the
    memory as it was (every step learned from is in it: one-step transitions) and trains to
    its end, and no actor is left. (DQN's Ape-X run, its n-step windows and its replay's
    checkpoint: tests/distributed/test_apex.py and `cartpole_apex` in test_train.py.)"""
    from tests.distributed.test_actor_learner import _scalars

    others = set(_actor_processes("TransitionActor"))  # Another run's, on another Ray.

    def actors():
        return set(_actor_processes("TransitionActor")) - others

    logdir = tmp_path / "run"
    kwargs = f"{{fault: kill, after: 40, once: {tmp_path / 'once'}}}"
    command = [sys.executable, "-m", "batchrl.scripts.train", "--config=pendulum_sac",
               f"--logdir={logdir}", "--no-progress", "--set", f"env={FAULTY}", "--set",
               f"env_kwargs={kwargs}", "--set", "max_length=200", "--set", "actors=1",
               "--set", "envs_per_actor=1", "--set", "rollout_length=10", "--set",
               "worker_restarts=1", "--set", "policy_layers=[8]", "--set",
               "value_layers=[8]", "--set", "jit_update=false", "--set", "steps=600",
               "--set", "eval_every=200", "--set", "eval_episodes=1", "--set",
               "log_every=100", "--set", "learning_starts=50", "--set", "save_replay=true",
               "--set", f"ray_address={ray_cluster.address}"]
    output = _interrupt_at_first_step(command, actors, 1)
    assert (tmp_path / "once").exists(), "the fault happened"
    assert _scalars(logdir / "train", "actors/restarts")[-1] == 1, output
    stopped = int(output.split("Stopped at step ")[1].split(";")[0].replace(",", ""))
    version = _version(logdir)
    assert version > 0

    resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    size = int(resumed.stdout.split("Replay memory: ")[1].split(" ")[0].replace(",", ""))
    assert size == stopped, resumed.stdout
    assert "step        600" in resumed.stdout, resumed.stdout
    assert _scalars(logdir / "train", "apex/replay_fill")[-1] > 0
    assert _version(logdir) > version  # The resumed learner published again.
    assert not actors()

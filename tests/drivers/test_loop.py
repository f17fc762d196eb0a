"""Loop phases, summaries, checkpoints and resume, with BatchPPO on MockEnvironment."""

import shutil
import time
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from batchrl.drivers.loop import Loop
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.native_tasks import Pendulum
from batchrl.scripts.events import read_scalars
from tests.drivers.ppo_loops import mock_batch, ppo_loop


def _loop(logdir, steps, seed=0, steps_per_call=1, batch_env=None, jit_compile=False,
          started_at=None):
    """A Loop of BatchPPO on `batch_env` (default: 4 MockEnvironments with episodes of 3-6
    steps), evaluating every 40 steps and logging every 20."""
    if batch_env is None:
        batch_env = mock_batch(4, (3, 6), seed)
    loop, algo, step, _ = ppo_loop(
        logdir, batch_env, 8, 6, {"update_every": 4, "update_epochs": 2, "seed": seed},
        steps=steps, eval_every=40, eval_episodes=4, steps_per_call=steps_per_call,
        jit_compile=jit_compile, started_at=started_at)
    return loop, algo, step


def _scalars(directory, tag):
    return [(scalar.step, scalar.value) for scalar in read_scalars(directory, tag)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One Loop run of 80 steps (two phases) from a fresh start, `started_at` 50 s before
    the Loop was made, its initial weights those of `tf.keras.utils.set_random_seed(0)`;
    before the run, a call of 0 steps. Keeps what the call and the callbacks saw, the
    weights after the first train phase, and the state the last checkpoint holds."""
    logdir = tmp_path_factory.mktemp("loop")
    tf.keras.utils.set_random_seed(0)
    created = time.time()
    loop, algo, step = _loop(logdir, steps=80, started_at=created - 50.0)
    before = [v.numpy().copy() for v in algo.networks.policy.variables]
    done, score = loop._call(False, False, 0)
    zero_call = SimpleNamespace(
        rows=(done.shape[0], score.shape[0]), tracing_count=loop.tracing_count(),
        step=int(step.numpy()),
        weights_kept=all(np.array_equal(variable.numpy(), value) for variable, value
                         in zip(algo.networks.policy.variables, before, strict=True)),
        episode_steps=int(algo._episodes.length.numpy().sum()))
    seen, first_weights = [], []

    def on_phase(result):
        seen.append(result.name)
        if result.name == "train" and not first_weights:
            first_weights.extend(v.numpy() for v in algo.networks.policy.trainable_variables)

    results = loop.run(on_phase=on_phase, on_ready=lambda: seen.append(
        (loop.startup_seconds, loop.tracing_seconds, int(step.numpy()))))
    return SimpleNamespace(
        logdir=logdir, loop=loop, step=int(step.numpy()), results=results, seen=seen,
        created=created, finished=time.time(), zero_call=zero_call,
        first_weights=first_weights,
        weights=[v.numpy() for v in algo.networks.policy.trainable_variables],
        slots=[v.numpy() for v in algo.checkpoint_state["policy_optimizer"].variables],
        observ_count=int(algo.checkpoint_state["observ_filter"].count),
        kl_penalty=float(algo.checkpoint_state["kl_penalty"].numpy()),
        random_state=algo.checkpoint_state["random"].state.numpy().copy())


def _copy(trained, tmp_path):
    """A copy of the trained run's directory, for a test that writes to it."""
    return shutil.copytree(trained.logdir, tmp_path / "run")


def test_phases_summaries_and_checkpoints(trained):
    results, loop, logdir = trained.results, trained.loop, trained.logdir
    assert trained.step == 80
    assert [r.name for r in results] == ["train", "eval", "train", "eval"]
    assert [r.global_step for r in results] == [40, 40, 80, 80]
    assert all(r.steps == 40 for r in results if r.name == "train")
    evals = [r for r in results if r.name == "eval"]
    assert all(len(r.scores) == 4 and len(r.lengths) == 4 for r in evals), "one per agent"
    assert all(3 <= length <= 6 for r in evals for length in r.lengths)
    assert loop.tracing_count() == 1
    train_scores = _scalars(logdir / "train", "mean_score")
    eval_scores = _scalars(logdir / "eval", "mean_score")
    assert [s for s, _ in eval_scores] == [40, 80]
    assert len(train_scores) >= 4  # Every 20 steps.
    assert _scalars(logdir / "eval", "mean_length")
    assert _scalars(logdir / "train", "ppo/kl"), "PPO update summaries in train/"
    np.testing.assert_allclose([v for _, v in eval_scores], [r.mean_score for r in evals],
                               rtol=1e-6)
    assert sorted(p.name for p in logdir.glob("ckpt-*.index")) == [
        "ckpt-40.index", "ckpt-80.index"]
    # Each train phase's speed, at its global step: its steps over its seconds.
    trains = [r for r in results if r.name == "train"]
    speeds = _scalars(logdir / "train", "time/train_steps_per_second")
    seconds = _scalars(logdir / "train", "time/train_phase_seconds")
    assert [s for s, _ in speeds] == [s for s, _ in seconds] == [40, 80]
    np.testing.assert_allclose([v for _, v in seconds], [r.seconds for r in trains], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in speeds], [40 / r.seconds for r in trains],
                               rtol=1e-6)


def test_compiled_with_xla_the_loop_writes_the_train_scores_itself(tmp_path):
    """`jit_compile`: XLA compiles no summaries, so the Loop writes the train phase's
    `mean_score` at every `log_every` crossing, from the episodes it collected."""
    loop, algo, _ = _loop(tmp_path, steps=80, steps_per_call=5, jit_compile=True,
                          batch_env=Pendulum(4, max_episode_steps=5, seed=0))
    optimizer = algo.checkpoint_state["policy_optimizer"]
    results = loop.run()
    assert [(r.name, r.global_step) for r in results] == [
        ("train", 40), ("eval", 40), ("train", 80), ("eval", 80)]
    train = [r for r in results if r.name == "train"]
    assert all(len(r.scores) == 8 and set(r.lengths) == {5} for r in train)
    # 16 episodes of 5 steps, 4 per update: 4 updates of 2 epochs of one Adam step.
    assert int(optimizer.iterations.numpy()) == 8
    train_scores = _scalars(tmp_path / "train", "mean_score")
    assert [s for s, _ in train_scores] == [0, 20, 40, 60]
    np.testing.assert_allclose([v for _, v in train_scores],
                               [np.mean(r.scores[i:i + 4]) for r in train for i in (0, 4)],
                               rtol=1e-6)
    assert not _scalars(tmp_path / "train", "ppo/kl"), "nothing inside the call writes"
    assert loop.tracing_count() == 1


def test_several_steps_per_call_train_like_one(trained, tmp_path):
    """3 batch steps per call (the last call of each 10-step phase runs 1): same phases,
    same episodes, same weights as one step per call (the first phase of `trained`)."""
    tf.keras.utils.set_random_seed(0)  # The same initial weights.
    loop, algo, step = _loop(tmp_path, steps=40, steps_per_call=3)
    three = loop.run()
    assert int(step.numpy()) == 40
    assert loop.tracing_count() == 1
    one = trained.results[:2]
    assert [(r.name, r.global_step) for r in three] == [(r.name, r.global_step) for r in one]
    for a, b in zip(one, three, strict=True):
        if a.name == "train":
            assert a.steps == b.steps == 40
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)
            assert a.lengths == b.lengths
        else:
            assert len(b.scores) == 4
    for a, b in zip(trained.first_weights,
                    algo.checkpoint_state["policy"].trainable_variables, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-6)
    assert [s for s, _ in _scalars(tmp_path / "eval", "mean_score")] == [40]
    assert len(_scalars(tmp_path / "train", "mean_score")) >= 2


def test_resume_restores_and_continues(trained, tmp_path):
    """A Loop of other seeds restores the trained run's last checkpoint and trains on; made
    without `started_at`, it writes no start-up seconds."""
    logdir = _copy(trained, tmp_path)
    loop, algo, step = _loop(logdir, steps=120, seed=5)
    assert loop.restore() is not None
    assert int(step.numpy()) == 80
    for saved, restored in zip(trained.weights, algo.networks.policy.trainable_variables,
                               strict=True):
        np.testing.assert_array_equal(saved, restored.numpy())
    restored_slots = algo.checkpoint_state["policy_optimizer"].variables
    slots = trained.slots
    assert len(slots) == len(restored_slots) > 2 and int(slots[0]) > 0  # Iterations, moments.
    for saved, restored in zip(slots, restored_slots, strict=True):
        np.testing.assert_array_equal(saved, restored.numpy())
    assert int(algo.checkpoint_state["observ_filter"].count) == trained.observ_count
    assert float(algo.checkpoint_state["kl_penalty"].numpy()) == trained.kl_penalty
    results = loop.run()
    assert [r.global_step for r in results] == [120, 120]
    assert [s for s, _ in _scalars(logdir / "eval", "mean_score")] == [40, 80, 120]
    assert loop.startup_seconds is None
    assert [s for s, _ in _scalars(logdir / "eval", "time/startup_seconds")] == [40, 80]


def test_weights_with_nan_are_never_saved_over_a_good_checkpoint(trained, tmp_path):
    logdir = _copy(trained, tmp_path)
    loop, algo, step = _loop(logdir, steps=80)
    loop.restore()
    good = loop.manager.latest_checkpoint
    assert good == str(logdir / "ckpt-80")
    weights = algo.networks.policy.trainable_variables[0]
    weights.assign(np.full(weights.shape, np.nan, np.float32))
    step.assign(100)
    with pytest.raises(FloatingPointError, match="non-finite values in .*policy"):
        loop.save()
    assert loop.manager.latest_checkpoint == good
    assert not list(logdir.glob("ckpt-100*"))


def test_random_generator_state_is_restored(trained, tmp_path):
    loop, algo, _ = _loop(_copy(trained, tmp_path), steps=80, seed=9)
    assert not np.array_equal(algo.checkpoint_state["random"].state.numpy(),
                              trained.random_state)
    loop.restore()
    np.testing.assert_array_equal(algo.checkpoint_state["random"].state.numpy(),
                                  trained.random_state)


def test_a_call_of_zero_steps_traces_and_changes_nothing(trained):
    """The Loop's first call runs 0 steps: it builds the graph (timed as
    `tracing_seconds`) and leaves the environments and the algorithm as they were."""
    zero_call, loop, logdir = trained.zero_call, trained.loop, trained.logdir
    assert zero_call.rows == (0, 0)
    assert zero_call.tracing_count == 1 and zero_call.step == 0
    assert zero_call.weights_kept and zero_call.episode_steps == 0
    assert loop.tracing_count() == 1 and loop.tracing_seconds > 0
    assert [s for s, _ in _scalars(logdir / "eval", "time/tracing_seconds")] == [40, 80]
    training = _scalars(logdir / "eval", "time/training_seconds")
    assert training[0][1] > loop.tracing_seconds


def test_startup_seconds_run_from_started_at_to_the_tracing(trained):
    """`on_ready` is called once, after tracing and before the first phase, with
    `startup_seconds` (from `started_at` to the tracing) set and then written per eval;
    a Loop without `started_at`: `test_resume_restores_and_continues`."""
    (startup, tracing, at_step), *phases = trained.seen
    assert phases == ["train", "eval", "train", "eval"] and at_step == 0 and tracing > 0
    assert 50.0 <= startup <= 50.0 + (trained.finished - trained.created)
    assert _scalars(trained.logdir / "eval", "time/startup_seconds") == [
        (40, pytest.approx(startup)), (80, pytest.approx(startup))]


def test_episodes_cut_short_count_nowhere_but_end_the_running_length():
    running = np.array([3, 5, 2])
    scores, lengths = [], []
    done = np.array([True, True, False])
    Loop._collect(done, np.array([-1.0, np.nan, -2.0]), running, scores, lengths)
    assert scores == [-1.0] and lengths == [4]
    assert running.tolist() == [0, 0, 3]


def test_a_train_phase_shorter_than_an_episode_says_no_episode_ended(tmp_path, capsys):
    """4 agents, train phases of 40 steps (10 per agent), episodes of 12-15 steps: no
    training episode ever ends (each phase begins new ones); the printed lines say so and
    why, with no `nan`, and no train score summary is written (none NaN)."""
    loop, _, _, _ = ppo_loop(tmp_path, mock_batch(4, (12, 15)), 8, 15, steps=80,
                             eval_every=40, eval_episodes=4)
    capsys.readouterr()
    results = loop.run()
    assert [len(r.scores) for r in results] == [0, 4, 0, 4]
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert ("train: no episode ended in this phase (phases of 10 steps per agent, "
                "shorter than an episode; ") in line, line
        assert "nan" not in line.lower() and "eval score" in line
    values = [value for _, value in _scalars(tmp_path / "train", "mean_score")]
    assert values == []
    assert np.isfinite([v for _, v in _scalars(tmp_path / "eval", "mean_score")]).all()


def test_compile_ahead_runs_the_xla_update_and_sets_every_variable_back(tmp_path):
    """With `jit_update`, `compile_ahead` (which `run` calls after the call of 0 steps)
    runs the compiled update, so that XLA compiles it before the first train phase, and
    leaves every variable of `checkpoint_state` and `progress_state` as it was. Here the
    memory holds episodes, so the update it runs changes the weights, the optimizer's
    moments, the generator and the memory: each is set back. Catches: a restore that
    misses any of them; an update not run ahead."""
    loop, algo, _, _ = ppo_loop(
        tmp_path, mock_batch(4, (3, 6)), 8, 6,
        {"update_every": 4, "update_epochs": 2, "seed": 0, "jit_update": True},
        steps=80, eval_every=40, eval_episodes=4)
    for count in range(4):  # Episodes of 3-6 steps: some in the memory, no update.
        loop._call(False, count == 0, 1)
    _, length = algo._memory.data()
    assert 0 < int(tf.reduce_sum(tf.cast(length > 0, tf.int32))) < 4
    state = tf.train.Checkpoint(**algo.checkpoint_state, **algo.progress_state)
    before = tf.train.load_checkpoint(state.write(str(tmp_path / "before")))
    calls = []
    compiled = algo._update
    algo._update = lambda: calls.append(1) or compiled()
    algo.compile_ahead()
    assert calls == [1]
    after = tf.train.load_checkpoint(state.write(str(tmp_path / "after")))
    names = before.get_variable_to_shape_map()
    assert any("optimizer" in name for name in names)
    assert any("memory" in name for name in names)
    for name in names:
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_array_equal(after.get_tensor(name), before.get_tensor(name),
                                          err_msg=name)


@pytest.mark.parametrize("eval_episodes, counted, rounds", [
    (2, [3, 3], [3]), (6, [3, 3, 20, 20, 3, 3], [20, 3])])
def test_an_eval_counts_the_first_episode_of_the_lowest_numbered_agents(
        tmp_path, eval_episodes, counted, rounds):
    """Agents 0-1 play episodes of 3 steps, agents 2-3 of 20: an eval of 2 episodes counts
    agents 0 and 1 and ends after their 3 steps; one of 6 counts all four, then 0 and 1
    again, lasting 20 + 3 steps of the batch."""
    envs = [MockEnvironment((3,), (1,), length, length) for length in (3, 3, 20, 20)]
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    loop, _, _, _ = ppo_loop(tmp_path, batch_env, 8, 20, steps=8, eval_every=8,
                             eval_episodes=eval_episodes)
    evaluation = [result for result in loop.run() if result.name == "eval"][0]
    assert evaluation.lengths == counted
    assert evaluation.steps == 4 * sum(rounds)

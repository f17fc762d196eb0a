"""Loop phases, summaries, checkpoints and resume, with BatchPPO on MockEnvironment."""

import time

import numpy as np
import pytest
import tensorflow as tf

from batchrl import configs
from batchrl.algorithms.ppo import PPO
from batchrl.drivers.loop import Loop
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.envs import Pendulum
from batchrl.networks import feed_forward_gaussian
from batchrl.scripts.events import read_scalars


def _loop(logdir, steps, seed=0, steps_per_call=1, batch_env=None, jit_compile=False,
          started_at=None):
    """A Loop of BatchPPO on `batch_env` (default: 4 MockEnvironments with episodes of 3-6
    steps), evaluating every 40 steps and logging every 20."""
    if batch_env is None:
        envs = [MockEnvironment((3,), (1,), 3, 6) for _ in range(4)]
        for index, env in enumerate(envs):
            env.reset(seed=seed + index)
        batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    config = configs.load("default", {"policy_layers": [8], "value_layers": [8],
                                      "update_every": 4, "update_epochs": 2, "seed": seed})
    config.update(network=feed_forward_gaussian, max_length=6)
    step = tf.Variable(0, dtype=tf.int64)
    is_training = tf.Variable(True)
    should_log = tf.Variable(True)
    algo = PPO(batch_env, step, is_training, should_log, config)
    checkpoint = tf.train.Checkpoint(step=step, **algo.checkpoint_state)
    loop = Loop(logdir, batch_env, algo, step, is_training, should_log, checkpoint,
                steps=steps, eval_every=40, eval_episodes=4, log_every=20, progress=False,
                steps_per_call=steps_per_call, jit_compile=jit_compile, started_at=started_at)
    return loop, algo, step


def _scalars(directory, tag):
    return [(scalar.step, scalar.value) for scalar in read_scalars(directory, tag)]


def test_phases_summaries_and_checkpoints(tmp_path):
    loop, _, step = _loop(tmp_path, steps=80)
    results = loop.run()
    assert int(step.numpy()) == 80
    assert [r.name for r in results] == ["train", "eval", "train", "eval"]
    assert [r.global_step for r in results] == [40, 40, 80, 80]
    assert all(r.steps == 40 for r in results if r.name == "train")
    evals = [r for r in results if r.name == "eval"]
    assert all(len(r.scores) == 4 and len(r.lengths) == 4 for r in evals), "one per agent"
    assert all(3 <= length <= 6 for r in evals for length in r.lengths)
    assert loop.tracing_count() == 1
    train_scores = _scalars(tmp_path / "train", "mean_score")
    eval_scores = _scalars(tmp_path / "eval", "mean_score")
    assert [s for s, _ in eval_scores] == [40, 80]
    assert len(train_scores) >= 4  # Every 20 steps.
    assert _scalars(tmp_path / "eval", "mean_length")
    assert _scalars(tmp_path / "train", "ppo/kl"), "PPO update summaries in train/"
    np.testing.assert_allclose([v for _, v in eval_scores], [r.mean_score for r in evals],
                               rtol=1e-6)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == [
        "ckpt-40.index", "ckpt-80.index"]
    # Each train phase's speed, at its global step: its steps over its seconds.
    trains = [r for r in results if r.name == "train"]
    speeds = _scalars(tmp_path / "train", "time/train_steps_per_second")
    seconds = _scalars(tmp_path / "train", "time/train_phase_seconds")
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


def test_several_steps_per_call_train_like_one(tmp_path):
    """3 batch steps per call (the last call of each 10-step phase runs 1): same phases,
    same episodes, same weights as one step per call."""
    runs = {}
    for steps_per_call in (1, 3):
        tf.keras.utils.set_random_seed(0)  # The same initial weights.
        loop, algo, step = _loop(tmp_path / str(steps_per_call), steps=40,
                                 steps_per_call=steps_per_call)
        runs[steps_per_call] = (loop.run(), algo, loop)
        assert int(step.numpy()) == 40
        assert loop.tracing_count() == 1
    (one, algo_one, _), (three, algo_three, _) = runs[1], runs[3]
    assert [(r.name, r.global_step) for r in three] == [(r.name, r.global_step) for r in one]
    for a, b in zip(one, three, strict=True):
        if a.name == "train":
            assert a.steps == b.steps == 40
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)
            assert a.lengths == b.lengths
        else:
            assert len(b.scores) == 4
    for a, b in zip(algo_one.checkpoint_state["policy"].trainable_variables,
                    algo_three.checkpoint_state["policy"].trainable_variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    assert [s for s, _ in _scalars(tmp_path / "3" / "eval", "mean_score")] == [40]
    assert len(_scalars(tmp_path / "3" / "train", "mean_score")) >= 2


def test_resume_restores_and_continues(tmp_path):
    loop, algo, step = _loop(tmp_path, steps=40)
    loop.run()
    weights = [v.numpy() for v in algo.networks.policy.trainable_variables]
    slots = [v.numpy() for v in algo.checkpoint_state["policy_optimizer"].variables]
    count = int(algo.checkpoint_state["observ_filter"].count)
    penalty = float(algo.checkpoint_state["kl_penalty"].numpy())

    loop, algo, step = _loop(tmp_path, steps=80, seed=5)
    assert loop.restore() is not None
    assert int(step.numpy()) == 40
    for saved, restored in zip(weights, algo.networks.policy.trainable_variables, strict=True):
        np.testing.assert_array_equal(saved, restored.numpy())
    restored_slots = algo.checkpoint_state["policy_optimizer"].variables
    assert len(slots) == len(restored_slots) > 2 and int(slots[0]) > 0  # Iterations, moments.
    for saved, restored in zip(slots, restored_slots, strict=True):
        np.testing.assert_array_equal(saved, restored.numpy())
    assert int(algo.checkpoint_state["observ_filter"].count) == count
    assert float(algo.checkpoint_state["kl_penalty"].numpy()) == penalty
    results = loop.run()
    assert [r.global_step for r in results] == [80, 80]
    assert [s for s, _ in _scalars(tmp_path / "eval", "mean_score")] == [40, 80]


def test_weights_with_nan_are_never_saved_over_a_good_checkpoint(tmp_path):
    loop, algo, step = _loop(tmp_path, steps=40)
    loop.run()
    good = loop.manager.latest_checkpoint
    weights = algo.networks.policy.trainable_variables[0]
    weights.assign(np.full(weights.shape, np.nan, np.float32))
    step.assign(60)
    with pytest.raises(FloatingPointError, match="non-finite values in .*policy"):
        loop.save()
    assert loop.manager.latest_checkpoint == good
    assert not list(tmp_path.glob("ckpt-60*"))


def test_random_generator_state_is_restored(tmp_path):
    loop, algo, _ = _loop(tmp_path, steps=40)
    loop.run()
    state = algo.checkpoint_state["random"].state.numpy().copy()
    loop, algo, _ = _loop(tmp_path, steps=40, seed=9)
    assert not np.array_equal(algo.checkpoint_state["random"].state.numpy(), state)
    loop.restore()
    np.testing.assert_array_equal(algo.checkpoint_state["random"].state.numpy(), state)


def test_a_call_of_zero_steps_traces_and_changes_nothing(tmp_path):
    """The Loop's first call runs 0 steps: it builds the graph (timed as
    `tracing_seconds`) and leaves the environments and the algorithm as they were."""
    loop, algo, step = _loop(tmp_path, steps=40)
    before = [v.numpy().copy() for v in algo.networks.policy.variables]
    done, score = loop._call(False, False, 0)
    assert done.shape[0] == 0 and score.shape[0] == 0
    assert loop.tracing_count() == 1 and int(step.numpy()) == 0
    for variable, value in zip(algo.networks.policy.variables, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)
    assert int(algo._episodes.length.numpy().sum()) == 0
    loop.run()
    assert loop.tracing_count() == 1 and loop.tracing_seconds > 0
    assert [s for s, _ in _scalars(tmp_path / "eval", "time/tracing_seconds")] == [40]
    training = _scalars(tmp_path / "eval", "time/training_seconds")
    assert training[0][1] > loop.tracing_seconds


def test_startup_seconds_run_from_started_at_to_the_tracing(tmp_path):
    """`on_ready` is called once, after tracing and before the first phase, with
    `startup_seconds` (from `started_at` to the tracing) set and then written per eval."""
    created = time.time()
    loop, _, step = _loop(tmp_path / "timed", steps=80, started_at=created - 50.0)
    seen = []
    loop.run(on_phase=lambda result: seen.append(result.name),
             on_ready=lambda: seen.append((loop.startup_seconds, loop.tracing_seconds,
                                           int(step.numpy()))))
    (startup, tracing, at_step), *phases = seen
    assert phases == ["train", "eval", "train", "eval"] and at_step == 0 and tracing > 0
    assert 50.0 <= startup <= 50.0 + (time.time() - created)
    assert _scalars(tmp_path / "timed" / "eval", "time/startup_seconds") == [
        (40, pytest.approx(startup)), (80, pytest.approx(startup))]
    loop, _, _ = _loop(tmp_path / "untimed", steps=40)
    loop.run()
    assert loop.startup_seconds is None
    assert not _scalars(tmp_path / "untimed" / "eval", "time/startup_seconds")


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
    envs = [MockEnvironment((3,), (1,), 12, 15) for _ in range(4)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    config = configs.load("default", {"policy_layers": [8], "value_layers": [8]})
    config.update(network=feed_forward_gaussian, max_length=15)
    step, is_training, should_log = (tf.Variable(0, dtype=tf.int64), tf.Variable(True),
                                     tf.Variable(True))
    algo = PPO(batch_env, step, is_training, should_log, config)
    checkpoint = tf.train.Checkpoint(step=step, **algo.checkpoint_state)
    loop = Loop(tmp_path, batch_env, algo, step, is_training, should_log, checkpoint,
                steps=80, eval_every=40, eval_episodes=4, log_every=20, progress=False)
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

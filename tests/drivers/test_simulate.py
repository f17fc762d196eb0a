import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl.drivers.simulate import act, episode_state, observe, simulate, simulate_steps
from batchrl.environments.application import ApplicationBatchEnv
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.scripts.events import read_scalars
from batchrl.tools.mock_algorithm import MockAlgorithm


class RecordingBatchEnv(BatchEnv):
    """Appends ('reset', indices) and ('step',) to a shared event list."""

    def __init__(self, envs, events):
        super().__init__(envs, blocking=True)
        self.events = events

    def reset(self, indices=None, seed=None):
        self.events.append(("reset", tuple(indices)))
        return super().reset(indices, seed)

    def step(self, actions):
        self.events.append(("step",))
        return super().step(actions)


class RecordingAlgorithm(MockAlgorithm):
    """Appends each method call, with its agent indices, to the shared event list, and keeps
    what `experience` received."""

    def __init__(self, batch_env, events):
        super().__init__(batch_env, seed=0)
        self.events = events
        self.transitions = []

    def _record(self, name, indices, *extra):
        def record(indices, *values):
            self.events.append((name, tuple(indices.tolist())))
            if name == "experience":
                self.transitions.append(values)
            return np.int32(0)
        return tf.numpy_function(record, [indices, *extra], tf.int32, name=name)

    def begin_episodes(self, agent_indices):
        return self._record("begin", agent_indices)

    def perform(self, agent_indices, observ):
        token = self._record("perform", agent_indices, observ)
        with tf.control_dependencies([token]):
            return super().perform(agent_indices, observ)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        return self._record("experience", agent_indices, observ, reward, done, nextob)

    def end_episodes(self, agent_indices):
        return self._record("end", agent_indices)


def _setup(durations, observ_shape=(2,)):
    events = []
    envs = [MockEnvironment(observ_shape, (1,), d, d) for d in durations]
    batch_env = InGraphBatchEnv(RecordingBatchEnv(envs, events))
    algo = RecordingAlgorithm(batch_env, events)

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2)
    def step(log, reset):
        return simulate(batch_env, algo, log, reset)

    return batch_env, algo, step, events


def test_calls_are_ordered_within_a_step():
    _, _, step, events = _setup([1, 2, 3, 4])
    step(False, False)
    step(False, False)
    assert events[:5] == [
        ("reset", (0, 1, 2, 3)), ("begin", (0, 1, 2, 3)), ("perform", (0, 1, 2, 3)),
        ("step",), ("experience", (0, 1, 2, 3))]
    assert events[5] == ("end", (0,))
    assert events[6:] == [
        ("reset", (0,)), ("begin", (0,)), ("perform", (0, 1, 2, 3)), ("step",),
        ("experience", (0, 1, 2, 3)), ("end", (0, 1))]


def test_forced_reset_restarts_every_episode():
    batch_env, _, step, events = _setup([5, 5, 5])
    step(False, False)
    done, score = step(False, False)
    assert not done.numpy().any()
    events.clear()
    done, score = step(False, True)
    assert events[0] == ("reset", (0, 1, 2)) and events[1] == ("begin", (0, 1, 2))
    for index in range(3):
        assert batch_env[index].steps == [2, 1]
    np.testing.assert_allclose(score.numpy(), batch_env.reward.numpy())


def test_score_is_the_running_return_and_nextob_the_final_observation():
    batch_env, algo, step, _ = _setup([3, 2])
    totals = np.zeros(2, np.float32)
    for _ in range(6):
        done, score = step(False, False)
        observ, reward, done_seen, nextob = algo.transitions[-1]
        totals += reward
        np.testing.assert_allclose(score.numpy(), totals, rtol=1e-6)
        np.testing.assert_array_equal(nextob, batch_env.observ.numpy())
        np.testing.assert_array_equal(done_seen, done.numpy())
        totals[done.numpy()] = 0.0


def test_mean_score_summaries(tmp_path):
    batch_env, algo, step, _ = _setup([2, 4])
    writer = tf.summary.create_file_writer(str(tmp_path))
    global_step = tf.Variable(0, dtype=tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2)
    def logged_step(log, reset):
        with writer.as_default(step=global_step):
            return simulate(batch_env, algo, log, reset)

    scores, lengths = [], []
    for index in range(8):
        done, score = logged_step(index == 7, False)
        scores.extend(score.numpy()[done.numpy()])
    writer.flush()
    lengths = [2, 2, 4, 2, 4, 2]  # Agent 0 ends at steps 2, 4, 6, 8; agent 1 at 4, 8.
    values = {}
    for path in tmp_path.iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                values[value.tag] = tf.make_ndarray(value.tensor)
    assert len(scores) == 6
    # Rewards are random around 0: the mean of float32 sums needs an absolute tolerance.
    np.testing.assert_allclose(values["mean_score"], np.mean(scores), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["mean_length"], np.mean(lengths), rtol=1e-6)


def test_forced_reset_forgets_episodes_not_yet_logged(tmp_path):
    batch_env, algo, _, _ = _setup([1, 1])
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2)
    def logged_step(log, reset):
        with writer.as_default(step=0):
            return simulate(batch_env, algo, log, reset)

    logged_step(False, False)  # Two episodes recorded, not logged.
    done, score = logged_step(True, True)  # Forced reset, then two more, logged.
    writer.flush()
    values = [tf.make_ndarray(value.tensor)
              for path in tmp_path.iterdir()
              for event in tf.compat.v1.train.summary_iterator(str(path))
              for value in event.summary.value if value.tag == "mean_score"]
    np.testing.assert_allclose(values, [score.numpy().mean()], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("observ_shape", [(1,), (2, 3)])
def test_mock_algorithm_actions_are_valid(observ_shape):
    batch_env, _, step, _ = _setup([3, 3, 3], observ_shape)
    for _ in range(5):
        step(False, False)
        action = batch_env.action.numpy()
        assert action.shape == (3, 1)
        assert (action >= -1).all() and (action <= 1).all()
    assert step.experimental_get_tracing_count() <= 2


def test_mock_algorithm_draws_within_each_dimension_s_bounds():
    space = gym.spaces.Box(np.array([0.0, -5.0, -np.inf], np.float32),
                           np.array([0.5, -4.0, np.inf], np.float32))

    class Batch:
        action_space = space

    algo = MockAlgorithm(Batch(), seed=3)
    action = algo.perform(tf.range(500), None).numpy()
    assert action.shape == (500, 3)
    low, high = np.array([0.0, -5.0, -1.0]), np.array([0.5, -4.0, 1.0])  # inf: [-1, 1].
    assert (action >= low).all() and (action <= high).all()
    # Spread over each interval, not collapsed onto one bound.
    assert (np.abs(action.mean(axis=0) - (low + high) / 2) < 0.1 * (high - low)).all()


def test_mock_algorithm_with_a_seed_repeats_its_actions_in_a_new_function():
    class Batch:
        action_space = gym.spaces.Discrete(3, start=1)

    def two_calls(seed):
        algo = MockAlgorithm(Batch(), seed=seed)
        draw = tf.function(lambda: algo.perform(tf.range(50), None), autograph=False)
        return draw().numpy(), draw().numpy()

    first, second = two_calls(7)
    again, _ = two_calls(7)
    assert set(first.tolist()) == {1, 2, 3}
    assert (first == again).all()  # The same seed, a new function: the same actions.
    assert (first != second).any()  # Later calls go on drawing.


def test_simulate_steps_runs_the_same_steps_in_one_call():
    batch_env, algo, _, events = _setup([1, 2, 3, 4])
    episode_state(batch_env)  # Created before the trace: no second trace.

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def steps(count):
        return simulate_steps(batch_env, algo, 4, False, False, count)

    done, score = steps(3)
    assert done.numpy().tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [False] * 4,  # Not run: count is 3.
    ]
    assert not score.numpy()[3].any()
    assert [e[0] for e in events].count("step") == 3
    done, _ = steps(4)  # Continues where the first call stopped.
    assert done.numpy()[0].tolist() == [True, True, False, True]
    assert steps.experimental_get_tracing_count() == 1
    # Each step is ordered as with single calls: the 4th step resets env 0 only.
    step_events = [i for i, e in enumerate(events) if e == ("step",)]
    assert events[step_events[2] + 1:step_events[3]][:3] == [
        ("experience", (0, 1, 2, 3)), ("end", (0, 2)), ("reset", (0, 2))]


def test_simulate_steps_resets_first_and_logs_once_at_the_end(tmp_path):
    batch_env, algo, _, events = _setup([2, 4])
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2)
    def steps(log, reset):
        with writer.as_default(step=0):
            return simulate_steps(batch_env, algo, 4, log, reset)

    steps(False, False)
    events.clear()
    steps(True, True)
    writer.flush()
    assert events[0] == ("reset", (0, 1))
    assert [e for e in events if e[0] == "reset"] == [("reset", (0, 1)), ("reset", (0,))]
    scalars = read_scalars(str(tmp_path), "mean_length")
    assert [s.value for s in scalars] == [pytest.approx((2 + 2 + 4) / 3)]


def test_simulate_steps_rejects_zero_steps():
    batch_env, algo, _, _ = _setup([2])
    with pytest.raises(ValueError, match="steps must be at least 1"):
        simulate_steps(batch_env, algo, 0, False, False)


def _drive_from_the_application(durations, calls):
    """Steps MockEnvironments in Python and feeds them to `act` / `observe`, as
    `batchrl.Agent` does; returns the algorithm's events and the dones and scores."""
    events = []
    envs = [MockEnvironment((2,), (1,), d, d) for d in durations]
    batch_env = ApplicationBatchEnv(len(envs), envs[0].observation_space,
                                    envs[0].action_space)
    algo = RecordingAlgorithm(batch_env, events)
    act_fn = tf.function(lambda observ: act(batch_env, algo, observ))
    observe_fn = tf.function(
        lambda *args: observe(batch_env, algo, *args, log=False))
    observ = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    results = []
    for _ in range(calls):
        action = act_fn(observ).numpy()
        steps = [env.step(a) for env, a in zip(envs, action, strict=True)]
        nextob = np.stack([s[0] for s in steps])
        reward = np.array([s[1] for s in steps], np.float32)
        terminated = np.array([s[2] for s in steps])
        truncated = np.array([s[3] for s in steps])
        done, score = observe_fn(reward, terminated, truncated, nextob)
        results.append((done.numpy().tolist(), score.numpy().tolist()))
        observ = np.stack([env.reset()[0] if d else o
                           for env, d, o in zip(envs, done.numpy(), nextob, strict=True)])
    return events, results


def test_act_and_observe_call_the_algorithm_as_simulate_does():
    """The application-driven halves make the same algorithm calls, with the same agent
    indices and the same dones and scores, as `simulate` on the same environments; the
    dones of episodes of 1, 2, 3 and 4 steps."""
    durations = [1, 2, 3, 4]
    app_events, app_results = _drive_from_the_application(durations, 6)
    _, _, step, events = _setup(durations)
    results = []
    for _ in range(6):
        done, score = step(False, False)
        results.append((done.numpy().tolist(), score.numpy().tolist()))
    algorithm_events = [e for e in events if e[0] not in ("reset", "step")]
    assert app_events == algorithm_events
    assert [d for d, _ in app_results] == [d for d, _ in results]
    assert [d for d, _ in app_results][:4] == [
        [True, False, False, False], [True, True, False, False],
        [True, False, True, False], [True, True, False, True]]


class InterruptingBatchEnv(RecordingBatchEnv):
    """Reports the episodes of the agents `cuts[k]` cut short at its k-th step (counting from
    1), as a batch that restarted their worker does: reward 0, truncated, `interrupted`."""

    def __init__(self, envs, events, cuts):
        super().__init__(envs, events)
        self._cuts = cuts
        self._steps = 0
        self._interrupted = np.zeros(len(envs), bool)

    @property
    def interrupted(self):
        return self._interrupted.copy()

    def step(self, actions):
        observ, reward, terminated, truncated, infos = super().step(actions)
        self._steps += 1
        self._interrupted = np.isin(np.arange(len(observ)), self._cuts.get(self._steps, []))
        reward = np.where(self._interrupted, 0.0, reward).astype(np.float32)
        return observ, reward, terminated, truncated | self._interrupted, infos


def test_episodes_cut_short_are_begun_anew_and_counted_nowhere(tmp_path):
    events = []
    envs = [MockEnvironment((2,), (1,), 3, 3) for _ in range(3)]
    batch_env = InGraphBatchEnv(InterruptingBatchEnv(envs, events, {2: [1]}))
    algo = RecordingAlgorithm(batch_env, events)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step():
        with writer.as_default(step=0):
            return simulate(batch_env, algo, True, False)

    results = [step() for _ in range(4)]
    writer.flush()
    dones = [done.numpy().tolist() for done, _ in results]
    assert dones == [[False] * 3, [False, True, False], [True, False, True], [False] * 3]
    scores = results[1][1].numpy()
    assert np.isnan(scores[1]) and np.isfinite(scores[[0, 2]]).all()
    assert batch_env.interrupted.numpy().tolist() == [False] * 3
    calls = [event for event in events if event[0] != "perform"]
    assert calls[:5] == [("reset", (0, 1, 2)), ("begin", (0, 1, 2)), ("step",),
                         ("experience", (0, 1, 2)), ("step",)]
    # At the cut, agent 1 gives no experience and ends no episode; the next step begins a
    # new one for it (its environment reset); agents 0 and 2 end theirs at the third step.
    assert calls[5:11] == [("experience", (0, 2)), ("reset", (1,)), ("begin", (1,)),
                           ("step",), ("experience", (0, 1, 2)), ("end", (0, 2))]
    # Only the two whole episodes are in the summary.
    assert [s.value for s in read_scalars(str(tmp_path), "mean_length")] == [3.0]

"""The actor (`batchrl.distributed.actor`) and the learner's loop
(`batchrl.distributed.learner`) in this process, without Ray: a pool stand-in hands the
loop fragments of actors that act with the weights it chooses, so that lags are known."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, configs, environments
from batchrl.algorithms import a2c, parts, registry
from batchrl.algorithms.builder import build_algorithm
from batchrl.distributed import actor as actor_lib
from batchrl.distributed import checks
from batchrl.distributed import learner as learner_lib
from batchrl.distributed.pool import Fragment
from batchrl.drivers.progress import report_line

ENVS, LENGTH = 2, 10


def _config(**overrides):
    return configs.load("cartpole_impala", {
        "policy_layers": [8], "value_layers": [8], "envs_per_actor": ENVS,
        "rollout_length": LENGTH, "num_agents": 2, "actors": 1, **overrides})


def test_episodes_sum_each_agents_rewards_between_its_ends_across_fragments():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 12))
    done = rng.random((3, 12)) < 0.3
    valid = np.array([12, 12, 9])  # Agent 2 was left out of its last 3 steps.
    running = {"score": np.zeros(3), "length": np.zeros(3, np.int64)}
    got = []
    for start in (0, 5):  # Two fragments, the second continuing the first.
        end = start + (5 if start == 0 else 7)
        fragment = {"reward": rewards[:, start:end], "done": done[:, start:end],
                    "length": np.clip(valid - start, 0, end - start)}
        scores, lengths = actor_lib.episodes(fragment, running)
        got.extend(zip(scores, lengths, strict=True))
    want = []  # Per agent: the valid steps split after each end; unfinished ones left out.
    for agent in range(3):
        ends = np.flatnonzero(done[agent, :valid[agent]])
        starts = np.concatenate([[0], ends[:-1] + 1])
        want.extend((rewards[agent, a:b + 1].sum(), b + 1 - a)
                    for a, b in zip(starts, ends, strict=True))
    np.testing.assert_allclose(sorted(got), sorted(want))
    assert len(got) == done[0].sum() + done[1].sum() + done[2, :9].sum()


def test_an_actor_acts_with_the_newest_publication_it_holds_when_a_call_starts():
    """Every publication is taken, a repeated version too (its step and statistics may be
    new); an older one than it holds is not; a call given a publication number waits for
    it, taking what arrives meanwhile from another thread (the pool's "weights" group)."""
    config = _config(worker_timeout=0.5)
    actor = actor_lib.FragmentActor(config, 0)
    info = actor.build()
    assert info["agents"] == ENVS and info["observ_shape"] == (4,)
    weights = _learner(config).actor.get_weights()
    plus = [[w + k for w in weights] for k in range(4)]

    def acting():
        return actor._actor.get_weights()

    result = actor.collect(3, weights)  # In-process: the given weights, at once.
    assert result["version"] == 3 and result["fragment"]["reward"].shape == (ENVS, LENGTH)
    _assert_equal(acting(), weights)
    actor.take_weights(0, 3, plus[1])
    assert actor.collect(publication=0)["version"] == 3  # The same version, new weights.
    _assert_equal(acting(), plus[1])
    actor.take_weights(2, 4, plus[2])
    actor.take_weights(1, 5, plus[3])  # Older than publication 2: ignored.
    assert actor.collect(publication=1)["version"] == 4
    _assert_equal(acting(), plus[2])
    assert actor.collect()["version"] == 4  # Nothing new: keeps what it has.
    late = threading.Timer(0.1, actor.take_weights, (3, 6, weights))
    late.start()
    assert actor.collect(publication=3)["version"] == 6  # Waited for it.
    late.join()
    _assert_equal(acting(), weights)
    with pytest.raises(TimeoutError, match="publication 4"):
        actor.collect(publication=4)


def _assert_equal(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_every_environment_of_a_run_starts_from_its_own_seed(monkeypatch):
    """The first observations of every environment of two actors, of actor 0 restarted and
    of the learner's (evaluation) batch are all distinct; a second run with the same seed
    starts each from the same one."""
    config = _config(actors=2, envs_per_actor=3, num_agents=4)
    first = []
    reset = environments.BatchEnv.reset

    def recording_reset(self, indices=None, seed=None):
        observ, infos = reset(self, indices, seed)
        first.append(observ)
        return observ, infos

    monkeypatch.setattr(environments.BatchEnv, "reset", recording_reset)

    def run():
        first.clear()
        environments.create_batch(config).close()  # The learner's.
        for index, incarnation in ((0, 0), (1, 0), (0, 1), (1, 1)):
            # What `FragmentActor(config, index, incarnation=...).build` creates.
            with environments.create_batch(
                    actor_lib.actor_config(config, index, incarnation)) as batch:
                assert len(batch) == 3
        return np.concatenate(first)

    observ = run()
    assert observ.shape == (4 + 4 * 3, 4)
    assert len(np.unique(observ, axis=0)) == len(observ)
    np.testing.assert_array_equal(run(), observ)


def _learner(config):
    batch_env = environments.create_batch(config)
    return build.build(config, batch_env).algo


class StalePool:
    """Stands in for `pool.ActorPool`: one in-process actor whose fragments act with the
    weights published `lags[i]` publications before the i-th `next` (cycling; the first
    publication when there are fewer)."""

    def __init__(self, config, lags):
        self.actor = actor_lib.FragmentActor(config, 0)
        self.agents = self.actor.build()["agents"]
        self.lags = lags
        self.published = []
        self.calls = 0
        self.restarts, self.discarded = [0], 0

    def publish(self, version, weights):
        self.published.append((version, weights))

    def next(self):
        lag = self.lags[self.calls % len(self.lags)]
        self.calls += 1
        version, weights = self.published[max(0, len(self.published) - 1 - lag)]
        result = self.actor.collect(version, weights)
        return Fragment(0, result["version"], result["fragment"], result["scores"],
                        result["lengths"], result["seconds"], 1)


def _loop(tmp_path, config, pool, fragments, broadcast_every, max_policy_lag,
          eval_episodes=0):
    """An `ActorLearnerLoop` over `pool` that learns from `fragments` fragments in one
    train phase (then evaluates `eval_episodes` episodes), and the learner it updates."""
    steps = fragments * ENVS * LENGTH
    config = configs.Config(config, steps=steps, eval_every=steps,
                            log_every=2 * ENVS * LENGTH, eval_episodes=eval_episodes)
    built = build.build(config, environments.create_batch(config))
    loop = learner_lib.ActorLearnerLoop(
        tmp_path, *built, pool=pool, broadcast_every=broadcast_every,
        max_policy_lag=max_policy_lag, steps=steps, eval_every=steps,
        eval_episodes=eval_episodes,
        log_every=config.log_every, progress=False)
    return loop, built


@pytest.mark.timeout(120)  # A learner that stalls fails here, with its stack.
def test_the_learner_drops_fragments_past_the_lag_bound_and_counts_the_rest(tmp_path):
    """Fragments acted 0, 2 and 3 publications back in turn, one publication per update,
    `max_policy_lag` 2. By hand: the learner at versions 0..5 takes fragments of versions
    0, 0, 0, 3, 2, 2 (fewer publications than the lag at first), lags 0, 1, 2, 0, 2 and 3:
    the last is dropped, counted and not learned from; a seventh, of version 5, makes the
    sixth update. The version counts the updates and is kept in the checkpoint; the lags
    of each window of two learned fragments reach the summaries."""
    config = _config(max_policy_lag=2)
    pool = StalePool(config, [0, 2, 3])
    loop, built = _loop(tmp_path, config, pool, 6, broadcast_every=1, max_policy_lag=2)
    before = built.algo.actor.get_weights()
    loop.run()
    assert loop.version == 6 and loop.dropped == 1 and pool.calls == 7
    assert int(built.step.numpy()) == 6 * ENVS * LENGTH  # Learned steps only.
    assert [version for version, _ in pool.published] == [0, 1, 2, 3, 4, 5, 6]
    assert not np.allclose(built.algo.actor.get_weights()[0], before[0])
    restored = tf.train.Checkpoint(policy_version=tf.Variable(0, dtype=tf.int64))
    restored.read(loop.manager.latest_checkpoint).expect_partial()
    assert int(restored.policy_version.numpy()) == 6
    train = tmp_path / "train"
    assert _scalars(train, "actors/policy_lag_min") == [0, 0, 0]
    assert _scalars(train, "actors/policy_lag_max") == [1, 2, 2]
    assert _scalars(train, "impala/loss"), "the updates' summaries"
    assert _scalars(train, "mean_score"), "the actors' episodes"
    assert _scalars(train, "actors/dropped_fragments")[-1] == 1


@pytest.mark.timeout(120)
def test_learn_traced_ahead_still_writes_the_updates_summaries(tmp_path):
    """The training command traces `learn` while the actors start (`trace_learn`), before
    any train phase: traced there, the updates write their summaries all the same (a
    function traced with no default writer would write none, ever after). The learner
    compiles nothing ahead for the in-process update it never runs (`compile_ahead`)."""
    config = _config()
    loop, built = _loop(tmp_path, config, StalePool(config, [0]), 4, broadcast_every=1,
                        max_policy_lag=None)
    compiled_ahead = []
    built.algo.compile_ahead = lambda: compiled_ahead.append(1)
    loop.trace_learn(ENVS)
    loop.run()
    assert compiled_ahead == []
    assert built.algo._learn_and_log.experimental_get_tracing_count() == 1
    assert len(_scalars(tmp_path / "train", "impala/loss")) == 2  # Logged every 2.


@pytest.mark.timeout(120)
def test_the_learners_step_function_acts_and_records_nothing(tmp_path):
    """The learner steps its own environments only to evaluate: its step function is
    traced without the algorithm's `experience` and `end_episodes` (so without the
    in-process update it never runs), and its eval phase plays the mean action: 2 agents'
    first episodes, their lengths those of the scores' steps."""
    config = _config()
    loop, built = _loop(tmp_path, config, StalePool(config, [0]), 1, broadcast_every=1,
                        max_policy_lag=None, eval_episodes=2)
    recorded = []
    built.algo.experience = lambda *args: recorded.append("experience")
    built.algo.end_episodes = lambda *args: recorded.append("end_episodes")
    _, evaluation = loop.run()
    assert recorded == [] and loop.tracing_count() == 1
    assert evaluation.name == "eval" and len(evaluation.scores) == 2
    assert evaluation.scores == [float(length) for length in evaluation.lengths]


@pytest.mark.timeout(120)
def test_a_fragment_dropped_for_lag_makes_the_learner_publish_so_it_never_stalls(tmp_path):
    """`broadcast_every` 4 and `max_policy_lag` 0 (which `check` refuses): the actor acts
    with the newest publication, so after each update its next fragment is one version
    old and dropped, whereupon the learner publishes its current version. By hand: four
    updates, three drops, publications of versions 0, 1, 2, 3 (on the drops) and 4 (the
    broadcast). A learner that does not publish on a drop stalls at version 1.

    On Pendulum (200-step episodes) the phase's fragments (10 steps per environment each)
    end no episode: its line says so, naming the actors' environments and the drops, not
    the learner's evaluation batch (3 environments)."""
    config = configs.load("pendulum_appo", {
        "policy_layers": [8], "value_layers": [8], "envs_per_actor": ENVS,
        "rollout_length": LENGTH, "num_agents": 3, "actors": 1})
    pool = StalePool(config, [0])
    loop, built = _loop(tmp_path, config, pool, 4, broadcast_every=4, max_policy_lag=0)
    (train,) = loop.run()
    assert loop.version == 4 and loop.dropped == 3
    assert [version for version, _ in pool.published] == [0, 1, 2, 3, 4]
    line = report_line([train], len(built.batch_env))
    assert ("train: no episode ended in this phase (the actors' fragments learned from held "
            f"{4 * ENVS * LENGTH} steps of their {ENVS} environments, {4 * LENGTH} each, "
            "and no episode's end; episodes run on across phases; 3 fragments dropped for "
            "lag;") in line


# A user's algorithm outside the registry (config `algorithm: MODULE:USER_PG`).
USER_PG = build_algorithm("user_pg", a2c.actor_loss, parts.gae_postprocess, parts.value_loss)


@pytest.mark.timeout(120)
def test_an_algorithm_of_build_algorithm_learns_from_actors_with_no_code_of_its_own(tmp_path):
    """A user's `build_algorithm` algorithm, named `module:NAME`, declares fragments (it
    reads `rollout_length`); the learner's check accepts it, and its loop takes an actor's
    fragments and makes one update of it on each, with its summaries."""
    name = f"{__name__}:USER_PG"
    assert registry.actors(name) == "fragments"
    config = configs.load("default", {
        "env": "CartPole-v1", "algorithm": name, "network": "feed_forward_categorical",
        "policy_layers": [8], "value_layers": [8], "envs_per_actor": ENVS,
        "rollout_length": LENGTH, "num_agents": 2, "actors": 1, "env_backend": "local"})
    checks.check(config)
    pool = StalePool(config, [0])
    loop, built = _loop(tmp_path, config, pool, 3, broadcast_every=1, max_policy_lag=None)
    before = built.algo.actor.get_weights()
    loop.run()
    assert loop.version == 3 and pool.calls == 3
    assert int(built.step.numpy()) == 3 * ENVS * LENGTH
    assert not np.allclose(built.algo.actor.get_weights()[0], before[0])
    assert _scalars(tmp_path / "train", "user_pg/policy/loss"), "the updates' summaries"


def _scalars(logdir, tag):
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()["tensors"]:
        return []
    return [float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)]


@pytest.mark.parametrize("config", ["cartpole_impala", "pendulum_appo"])
def test_c_bar_above_rho_bar_is_refused_before_anything_is_built(config):
    """`build.check`, which the train command runs before it starts actors or builds the
    learner: one line naming both keys."""
    with pytest.raises(configs.ConfigError, match=r"^config keys 'c_bar' \(1.0\) and "
                                                  r"'rho_bar' \(0.5\): [^\n]*$"):
        build.check(configs.load(config, {"rho_bar": 0.5, "c_bar": 1.0}))
    build.check(configs.load(config, {"rho_bar": 0.5, "c_bar": 0.5}))


def test_a_fragment_actor_builds_no_optimizer(optimizers_made):
    """An on-policy actor builds the acting half alone (`OnPolicyActor`): no Keras
    optimizer is made while it builds and records. Its fragments hold the agents' discounted
    returns (`reward_normalizer: return`, as cartpole_impala has it)."""
    made = optimizers_made
    actor = actor_lib.FragmentActor(_config(), 0)
    actor.build()
    fragment = actor.collect()["fragment"]
    assert fragment["reward"].shape == fragment["return"].shape == (ENVS, LENGTH)
    assert made == []
    _learner(_config())
    assert made  # The learner's, counted.


class OtherLearner:
    """Stands in for a `learners.RemoteLearner` Ray actor: `train.remote(updates,
    broadcast_every)` records what learner 0 asked and returns its steps."""

    def __init__(self):
        self.asked = []
        self.train = self

    def remote(self, updates, broadcast_every):
        self.asked.append((updates, broadcast_every))
        return updates * ENVS * LENGTH


class SameSums:
    """Stands in for `collective.AllReduce` of learners that all learned the same: the
    mean of the gradients is this learner's, and so is every sum's share."""

    def mean(self, gradients, name="gradients"):
        return gradients

    def sum(self, tensor, name):
        return tensor


@pytest.mark.timeout(120)
def test_learner_zero_starts_the_others_updates_and_counts_their_fragments(tmp_path,
                                                                          monkeypatch):
    """With one other learner, a phase of 2 x 3 fragments' steps makes 3 updates on each:
    learner 0 asks the other for 3 at the phase's start, takes 3 fragments of its own,
    counts 2 fragments' steps per update in the global step, and waits for the other's
    phase (`ray.get` of its call) before the phase ends."""
    import sys
    import types

    waited = []
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(
        get=lambda refs: waited.append(list(refs)) or refs, is_initialized=lambda: False))
    config = _config(max_policy_lag=None)
    pool = StalePool(config, [0])
    steps = 2 * 3 * ENVS * LENGTH
    config = configs.Config(config, steps=steps, eval_every=steps, log_every=steps,
                            eval_episodes=0)
    built = build.build(config, environments.create_batch(config))
    built.algo.share_update(SameSums())
    other = OtherLearner()
    loop = learner_lib.ActorLearnerLoop(
        tmp_path, *built, pool=pool, broadcast_every=2, learners=[other],
        fragment_steps=ENVS * LENGTH, steps=steps, eval_every=steps, eval_episodes=0,
        log_every=steps, progress=False)
    loop.run()
    assert other.asked == [(3, 2)]
    assert pool.calls == 3 and loop.version == 3
    assert int(built.step.numpy()) == steps
    assert waited == [[3 * ENVS * LENGTH]]

"""The actor (`batchrl.distributed.actor`) and the learner's loop
(`batchrl.distributed.learner`) in this process, without Ray: a pool stand-in hands the
loop fragments of actors that act with the weights it chooses, so that lags are known."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, configs, environments
from batchrl.distributed import actor as actor_lib
from batchrl.distributed import learner as learner_lib
from batchrl.distributed.pool import Fragment

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


def test_an_actor_acts_with_the_weights_of_the_version_it_was_given():
    config = _config()
    first, second = actor_lib.FragmentActor(config, 0), actor_lib.FragmentActor(config, 1)
    info = first.build()
    second.build()
    assert info["agents"] == ENVS and info["observ_shape"] == (4,)
    learner = _learner(config)
    weights = learner.actor.get_weights()
    result = first.collect(3, weights)
    assert result["version"] == 3 and result["fragment"]["reward"].shape == (ENVS, LENGTH)
    for got, want in zip(first._actor.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert first.collect(3, [w + 1 for w in weights])["version"] == 3  # Same version: kept.
    np.testing.assert_array_equal(first._actor.get_weights()[0], weights[0])
    assert first.collect(None, None)["version"] == 3  # None: keeps what it has.
    # Actors draw their own episodes (seeds config.seed + 1 + index).
    other = second.collect(3, weights)["fragment"]["observ"][:, 0]
    assert not np.allclose(other, result["fragment"]["observ"][:, 0])


def _learner(config):
    batch_env = environments.create_batch(config)
    return build.build(config, batch_env).algo


class StalePool:
    """Stands in for `pool.ActorPool`: one in-process actor whose fragments act with the
    weights published `lags[i]` publications before the i-th `next` (cycling)."""

    def __init__(self, config, lags):
        self.actor = actor_lib.FragmentActor(config, 0)
        self.actor.build()
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


def test_the_learner_drops_fragments_past_the_lag_bound_and_counts_the_rest(tmp_path):
    """Every other fragment acts with weights three versions old: with max_policy_lag 1
    those are dropped (counted, their steps not learned from), the others learned from;
    the version counts the updates and is kept in the checkpoint."""
    config = _config(steps=6 * ENVS * LENGTH, eval_every=6 * ENVS * LENGTH,
                     log_every=2 * ENVS * LENGTH, eval_episodes=0, max_policy_lag=1)
    built = build.build(config, environments.create_batch(config))
    pool = StalePool(config, [0, 3])
    loop = learner_lib.ActorLearnerLoop(
        tmp_path, *built, pool=pool, broadcast_every=1, max_policy_lag=1,
        steps=config.steps, eval_every=config.eval_every, eval_episodes=0,
        log_every=config.log_every, progress=False)
    before = built.algo.actor.get_weights()
    loop.run()
    assert loop.version == 6 and loop.dropped >= 2
    assert int(built.step.numpy()) == 6 * ENVS * LENGTH  # Learned steps only.
    assert [version for version, _ in pool.published] == [0, 1, 2, 3, 4, 5, 6]
    assert not np.allclose(built.algo.actor.get_weights()[0], before[0])
    restored = tf.train.Checkpoint(policy_version=tf.Variable(0, dtype=tf.int64))
    restored.read(loop.manager.latest_checkpoint).expect_partial()
    assert int(restored.policy_version.numpy()) == 6
    lags = _scalars(tmp_path / "train", "actors/policy_lag_max")
    assert lags and max(lags) <= 1
    assert _scalars(tmp_path / "train", "impala/loss"), "the updates' summaries"
    assert _scalars(tmp_path / "train", "mean_score"), "the actors' episodes"
    assert _scalars(tmp_path / "train", "actors/dropped_fragments")[-1] == loop.dropped


def _scalars(logdir, tag):
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()["tensors"]:
        return []
    return [float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)]


@pytest.mark.parametrize("overrides, message", [
    ({"algorithm": "ppo", "rollout_length": None}, "algorithm 'ppo' does not learn from"),
    ({"rollout_length": None}, "needs rollout_length"),
    ({"normalize_reward": True, "reward_normalizer": "return"}, "reward_normalizer: reward"),
])
def test_actor_learner_keys_that_cannot_work_are_config_errors(overrides, message):
    with pytest.raises(configs.ConfigError, match=message):
        learner_lib.check(configs.load("cartpole_impala", {"actors": 2, **overrides}))

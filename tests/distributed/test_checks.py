"""The checks of the actor-learner keys (`batchrl.distributed.checks`): one line per
mistake, and no TensorFlow needed."""

import pytest

from batchrl import configs
from batchrl.distributed import checks


class EpisodesOnly:
    """An algorithm of the four methods only (`build` accepts it: duck typing); it declares
    no `actors`."""

    begin_episodes = perform = experience = end_episodes = None


@pytest.mark.parametrize("overrides, message", [
    ({"algorithm": f"{__name__}:EpisodesOnly"},
     f"algorithm '{__name__}:EpisodesOnly' does not learn from actors; choices: "),
    ({"rollout_length": None}, "needs rollout_length"),
    ({"max_policy_lag": 0, "broadcast_every": 4},
     r"^config keys 'max_policy_lag' \(0\) and 'broadcast_every' \(4\): max_policy_lag "
     r"must be at least broadcast_every - 1"),
    ({"max_policy_lag": 2, "broadcast_every": 4}, "max_policy_lag must be at least"),
])
def test_actor_learner_keys_that_cannot_work_are_config_errors(overrides, message):
    with pytest.raises(configs.ConfigError, match=message) as raised:
        checks.check(configs.load("cartpole_impala", {"actors": 2, **overrides}))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("overrides", [
    {"max_policy_lag": 3, "broadcast_every": 4}, {"max_policy_lag": 0, "broadcast_every": 1},
    {"max_policy_lag": None, "broadcast_every": 8}])
def test_a_lag_bound_at_least_the_updates_between_publications_is_accepted(overrides):
    checks.check(configs.load("cartpole_impala", {"actors": 2, **overrides}))


@pytest.mark.parametrize("overrides, message", [
    ({"algorithm": "ppo", "rollout_length": 20, "update_epochs": 1},
     r"^config key 'learners' \(2\): algorithm 'ppo' does not share its update; impala and "
     r"appo do"),
    ({"actors": 3}, r"^config keys 'actors' \(3\) and 'learners' \(2\): each learner takes "
                    r"as many actors"),
    ({"max_policy_lag": 4}, r"^config key 'max_policy_lag' \(4\) with learners \(2\): the "
                            r"learners learn in lock-step"),
    ({"actors": 0}, r"^config key 'learners' \(2\) needs actors"),
])
def test_learners_that_cannot_share_the_update_are_config_errors(overrides, message):
    """`learners: 2` with an algorithm without `share_update`, actors that do not split
    evenly, or a lag bound that would make one learner drop a fragment: one line each."""
    config = configs.load("default", {"env": "CartPole-v1", "algorithm": "impala",
                                      "rollout_length": 20, "actors": 2, "learners": 2,
                                      **overrides})
    with pytest.raises(configs.ConfigError, match=message):
        checks.check(config)
    checks.check(configs.load("default", {
        "env": "CartPole-v1", "algorithm": "appo", "rollout_length": 20, "actors": 4,
        "learners": 2}))

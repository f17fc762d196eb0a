"""Per-algorithm defaults of config keys that default.yaml leaves null: the target networks'
updates (`target_update_rate`, `target_update_every`): a dqn config that sets nothing copies
its target every 10,000 updates (Mnih et al. 2015), sac and td3 average it every update at
0.005; and runs of older releases, which saved 0.005 and 1 for every algorithm, still load,
resume (but a dqn one with other settings) and build."""

import gymnasium as gym
import numpy as np
import pytest

import batchrl
from batchrl import build, configs
from batchrl.scripts import train

SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SMALL = {"value_layers": [8], "policy_layers": [8], "batch_size": 4, "learning_starts": 0,
         "replay_capacity": 50, "max_length": 10}


def _transitions(count, actions, seed=0):
    """`count` random transitions; `actions`: a Discrete `n`, or None for Box(-1, 1)."""
    rng = np.random.default_rng(seed)
    action = (rng.integers(0, actions, count) if actions else
              rng.uniform(-1, 1, (count, 1)).astype(np.float32))
    return {"observation": rng.uniform(-1, 1, (count, 3)).astype(np.float32),
            "action": action, "reward": rng.normal(size=count).astype(np.float32),
            "terminated": rng.random(count) < 0.2,
            "next_observation": rng.uniform(-1, 1, (count, 3)).astype(np.float32)}


def _weights(model):
    return [variable.numpy().copy() for variable in model.variables]


def test_a_dqn_config_that_sets_nothing_copies_its_target_every_10000_updates():
    agent = batchrl.Agent.create({"algorithm": "dqn", **SMALL}, SPACE, gym.spaces.Discrete(2),
                                 num_envs=1)
    assert agent.config.target_update_rate is None  # "The algorithm's": dqn's own.
    assert agent.config.target_update_every is None
    state = agent._algo.checkpoint_state
    online, target = state["policy"], state["target_policy"]
    initial = _weights(target)
    assert agent.update(_transitions(30, 2)) == 30
    for before, now in zip(initial, _weights(target), strict=True):
        np.testing.assert_array_equal(now, before)  # Not averaged towards the online one.
    assert not all(np.array_equal(trained, before)
                   for before, trained in zip(initial, _weights(online), strict=True))
    agent._algo.updates.assign(9998)
    assert agent.update(_transitions(1, 2, seed=1)) == 9999
    for before, now in zip(initial, _weights(target), strict=True):
        np.testing.assert_array_equal(now, before)
    assert agent.update(_transitions(1, 2, seed=2)) == 10000  # The 10,000th update copies.
    for now, trained in zip(_weights(target), _weights(online), strict=True):
        np.testing.assert_array_equal(now, trained)


def test_a_sac_config_that_sets_nothing_averages_its_targets_every_update():
    agent = batchrl.Agent.create({"algorithm": "sac", **SMALL}, SPACE,
                                 gym.spaces.Box(-1.0, 1.0, (1,), np.float32), num_envs=1)
    state = agent._algo.checkpoint_state
    online, target = state["critic"], state["target_critic"]
    before = _weights(target)
    assert agent.update(_transitions(1, None)) == 1
    for old, now, trained in zip(before, _weights(target), _weights(online), strict=True):
        np.testing.assert_allclose(now, 0.005 * trained + 0.995 * old, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("algorithm, rate, every", [("sac", 0.005, 1), ("td3", 0.005, 1),
                                                     ("dqn", 1.0, 10000)])
def test_null_takes_the_algorithms_own_and_a_set_value_wins(algorithm, rate, every):
    config = configs.load("default", {"algorithm": algorithm, "env": (
        "CartPole-v1" if algorithm == "dqn" else "Pendulum-v1"), **SMALL})
    built = build.build(config, _environments(config), process_eager=False)
    assert (built.algo._config.target_update_rate,
            built.algo._config.target_update_every) == (rate, every)
    # td3 refuses a target_update_every other than 1 (its targets move with the actor).
    every = 1 if algorithm == "td3" else 3
    config = configs.Config(config, target_update_rate=0.5, target_update_every=every)
    built = build.build(config, _environments(config), process_eager=False)
    assert (built.algo._config.target_update_rate,
            built.algo._config.target_update_every) == (0.5, every)


def _environments(config):
    from batchrl.environments.application import ApplicationBatchEnv

    action = (gym.spaces.Discrete(2) if config.algorithm == "dqn" else
              gym.spaces.Box(-1.0, 1.0, (1,), np.float32))
    return ApplicationBatchEnv(1, SPACE, action)


def _older_run(tmp_path, name, config):
    """A run directory of an older release: its config.yaml saved 0.005 and 1."""
    logdir = tmp_path / name
    logdir.mkdir()
    saved = configs.Config(config, target_update_rate=0.005, target_update_every=1)
    (logdir / "config.yaml").write_text(configs.dump(saved))
    (logdir / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    return logdir


def test_runs_of_older_releases_resume_and_build(tmp_path):
    for name in ("pendulum_sac", "pendulum"):  # SAC, and PPO (which reads neither key).
        logdir = _older_run(tmp_path, name, configs.load(name))
        saved = configs.read_run_config(logdir / "config.yaml")
        assert saved.target_update_rate is None and saved.target_update_every is None
        train.check_resume(logdir, configs.load(name))
        build.algorithm_class(saved)  # No "not read by algorithm 'ppo'" error.
    # A dqn run trained with them keeps them, and resumes only with them.
    dqn = configs.load("default", {"algorithm": "dqn", "env": "CartPole-v1"})
    logdir = _older_run(tmp_path, "dqn", dqn)
    saved = configs.read_run_config(logdir / "config.yaml")
    assert (saved.target_update_rate, saved.target_update_every) == (0.005, 1)
    with pytest.raises(configs.ConfigError, match=r"target_update_every: 1 -> None; "
                                                  r"target_update_rate: 0.005 -> None"):
        train.check_resume(logdir, dqn)
    train.check_resume(logdir, configs.Config(dqn, target_update_rate=0.005,
                                              target_update_every=1))

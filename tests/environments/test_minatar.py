"""MinAtar's games through Gymnasium's `module:ID` convention
(batchrl.environments.minatar)."""

import numpy as np
import pytest

from batchrl import configs, environments

BREAKOUT = "batchrl.environments.minatar:MinAtar/Breakout-v1"


def test_the_module_registers_the_games_and_frames_become_uint8():
    environments.check_env_id(BREAKOUT)
    assert environments.native_class(BREAKOUT) is None
    env = environments.create(BREAKOUT, 100)
    observation, _ = env.reset(seed=0)
    assert observation.dtype == np.uint8 and observation.shape == (10, 10, 4)
    assert set(np.unique(observation)) <= {0, 1}
    assert env.action_space.n == 3  # -v1: the game's minimal action set.
    env.close()


@pytest.mark.parametrize("env, message", [
    ("batchrl.environments.minatar:MinAtar/Breakot-v1",
     "module 'batchrl.environments.minatar' registers no Gymnasium environment "
     "'MinAtar/Breakot-v1'; close matches: MinAtar/Breakout-v1"),
    ("batchrl.environments.minatr:MinAtar/Breakout-v1",
     "cannot import module 'batchrl.environments.minatr'"),
])
def test_a_bad_module_or_id_is_a_config_error(env, message):
    with pytest.raises(configs.ConfigError, match=message):
        environments.check_env_id(env)


@pytest.mark.parametrize("name", ["minatar_breakout", "minatar_space_invaders"])
def test_the_configs_name_a_game_with_a_time_limit(name):
    config = configs.load(name)
    environments.check_env_id(config.env)
    assert environments.episode_limit(config) == config.max_length

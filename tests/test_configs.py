import pytest

from batchrl import configs


def test_named_config_is_layered_over_default():
    default = configs.load("default")
    pendulum = configs.load("pendulum")
    assert set(pendulum) == set(default)
    assert pendulum.env == "Pendulum-v1"
    assert pendulum.network == default.network
    assert pendulum.update_every != default.update_every or pendulum == default


def test_set_overrides_are_parsed_as_yaml():
    config = configs.load("pendulum", ["policy_lr=1e-4", "policy_layers=[64, 64]",
                                       "max_length=null", "env_processes=true", "seed=3"])
    assert config.policy_lr == pytest.approx(1e-4) and isinstance(config.policy_lr, float)
    assert config.policy_layers == [64, 64]
    assert config.max_length is None and config.env_processes is True and config.seed == 3
    assert configs.load("pendulum", ["discount=1"]).discount == 1.0


def test_dump_round_trips(tmp_path):
    config = configs.load("pendulum", ["seed=7"])
    path = tmp_path / "config.yaml"
    path.write_text(configs.dump(config))
    assert configs.read_run_config(path) == config


@pytest.mark.parametrize("overrides, message", [
    (["polcy_lr=1"], "unknown config key 'polcy_lr'.*did you mean policy_lr"),
    (["num_agents=two"], "'num_agents' must be an integer"),
    (["num_agents=0"], "'num_agents' must be positive"),
    (["num_workers=0"], "'num_workers' must be positive"),
    (["discount=1.5"], "'discount' must be between 0 and 1"),
    (["env_processes=1"], "'env_processes' must be true or false"),
    (["policy_layers=[0]"], "'policy_layers' must be a list of positive integers"),
    (["algorithm=sac"], "choices: ppo"),
    (["seed"], "KEY=VALUE"),
    (["steps=null"], "must not be null"),
])
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(configs.ConfigError, match=message):
        configs.load("pendulum", overrides)


def test_unknown_config_name_lists_the_available_ones():
    with pytest.raises(configs.ConfigError, match="unknown config 'pendulm'.*pendulum"):
        configs.load("pendulm")
    assert "pendulum" in configs.available() and "default" not in configs.available()


def test_config_file_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("num_agents: 3\n")
    assert configs.load(str(path)).num_agents == 3
    path.write_text("num_agent: 3\n")
    with pytest.raises(configs.ConfigError, match="unknown config key 'num_agent' in mine.yaml"):
        configs.load(str(path))


def test_run_config_of_an_older_run_takes_defaults_for_newer_keys(tmp_path):
    config = configs.load("pendulum")
    old = {key: value for key, value in config.items() if key != "worker_timeout"}
    path = tmp_path / "config.yaml"
    path.write_text(configs.dump(old))
    assert configs.read_run_config(path) == config

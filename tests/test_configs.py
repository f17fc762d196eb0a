import pytest
import ruamel.yaml

from batchrl import configs


def test_named_config_is_layered_over_default():
    # Every key comes from pendulum.yaml where it sets one, else from default.yaml, each
    # read here as plain YAML.
    yaml = ruamel.yaml.YAML(typ="safe", pure=True)
    raw_default = yaml.load(configs.CONFIG_DIR / "default.yaml")
    raw_pendulum = yaml.load(configs.CONFIG_DIR / "pendulum.yaml")
    pendulum = configs.load("pendulum")
    assert set(pendulum) == set(raw_default)
    for key, value in raw_default.items():
        assert pendulum[key] == raw_pendulum.get(key, value), key
    assert any(raw_pendulum[key] != raw_default[key] for key in raw_pendulum)
    assert set(raw_default) - set(raw_pendulum)  # Some keys are inherited.


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


@pytest.mark.parametrize("name", configs.available())
def test_every_shipped_config_sets_only_keys_its_algorithm_reads(name):
    """Each config under configs/ loads, and its algorithm reads every key it sets to
    other than the default (`build.algorithm_class`)."""
    from batchrl import build  # TensorFlow, for this test only.

    config = configs.load(name)
    algorithm = build.algorithm_class(config)
    default = configs.load("default")
    changed = {key for key in config if config[key] != default[key]}
    declared = set().union(*(other.config_keys for other in build.ALGORITHMS.values()))
    assert changed & declared <= algorithm.config_keys

import re

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
                                       "max_length=null", "env_backend=processes", "seed=3"])
    assert config.policy_lr == pytest.approx(1e-4) and isinstance(config.policy_lr, float)
    assert config.policy_layers == [64, 64]
    assert config.max_length is None and config.env_backend == "processes" and config.seed == 3
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
    (["target_update_rate=1.5"], "'target_update_rate' must be between 0 and 1"),
    (["target_update_rate=0"], "'target_update_rate' must be positive"),
    (["updates_per_step=0"], "'updates_per_step' must be positive"),
    (["learning_starts=-1"], "'learning_starts' must not be negative"),
    (["env_backend=true"], "'env_backend' must be a string, got True"),
    (["env_backend=gpu"], "'env_backend' is 'gpu'; choices: local, processes, envpool, ray"),
    (["policy_layers=[0]"], "'policy_layers' must be a list of positive integers"),
    (["algorithm=ddpg"], "choices: ppo, trpo, a2c, impala, appo, pqn, sac, td3, dqn"),
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
    # A file rewritten within the same second (same size, as likely the same mtime) is read
    # anew: the parsed files are kept by their text.
    path.write_text("num_agents: 4\n")
    assert configs.load(str(path)).num_agents == 4
    path.write_text("num_agents: [3\n")
    with pytest.raises(configs.ConfigError, match=r"mine.yaml is not valid YAML"):
        configs.load(str(path))
    path.write_text("- num_agents: 3\n")
    with pytest.raises(configs.ConfigError, match=r"mine.yaml must hold a mapping"):
        configs.load(str(path))


def test_loaded_configs_do_not_share_values():
    """A caller that changes a loaded config's list changes nothing that a later load or a
    run's config.yaml gives (the files are parsed once per process)."""
    first = configs.load("pendulum")
    expected = list(first.policy_layers)
    first.policy_layers.append(7)
    first.env_kwargs["spoiled"] = True
    again = configs.load("pendulum")
    assert again.policy_layers == expected and "spoiled" not in again.env_kwargs


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


@pytest.mark.parametrize("where", ["--set", "file"])
@pytest.mark.parametrize("value", [False, True])
def test_env_processes_is_a_one_line_error_naming_env_backend(tmp_path, where, value):
    """`env_processes` (releases before 2026-11-25) is refused wherever a config gives it;
    the message says what to write instead."""
    if where == "file":
        path = tmp_path / "old.yaml"
        path.write_text(f"env: Pendulum-v1\nenv_processes: {str(value).lower()}\n")
        name, overrides, source = str(path), [], "old.yaml"
    else:
        name, overrides, source = "pendulum", [f"env_processes={str(value).lower()}"], "--set"
    with pytest.raises(configs.ConfigError) as error:
        configs.load(name, overrides)
    message = str(error.value)
    assert "\n" not in message
    assert message == (f"config key 'env_processes' in {source} is replaced by env_backend: "
                       f"write env_backend: local (for false) or env_backend: processes (for "
                       f"true)")


def test_envpool_prefix_is_the_old_spelling_of_env_backend_envpool(tmp_path):
    new = configs.load("pendulum", ["env_backend=envpool"])
    assert new.env == "envpool:Pendulum-v1" and new.env_backend == "envpool"
    assert configs.load("pendulum", ["env=envpool:Pendulum-v1"]) == new
    path = tmp_path / "old_cheetah.yaml"
    path.write_text("env: envpool:HalfCheetah-v5\nnum_agents: 10\n")
    old = configs.load(str(path))
    assert (old.env, old.env_backend) == ("envpool:HalfCheetah-v5", "envpool")
    # The backend of a later layer wins, as for any key: Gymnasium's HalfCheetah-v5, local.
    assert configs.load(str(path), ["env_backend=local"]).env == "HalfCheetah-v5"
    assert configs.load("cheetah", ["env_backend=local"]).env == "HalfCheetah-v5"
    # Within one file or one --set, the two spellings contradict each other.
    path.write_text("env: envpool:HalfCheetah-v5\nenv_backend: ray\n")
    with pytest.raises(configs.ConfigError, match=r"^config keys 'env' \(envpool:HalfCheetah-v5\) "
                       r"and 'env_backend' \(ray\) contradict each other in old_cheetah.yaml: "
                       r"write env: HalfCheetah-v5 and choose the backend with env_backend "
                       r"alone \(envpool for EnvPool's task HalfCheetah-v5\)$"):
        configs.load(str(path))
    path.write_text("env: envpool:HalfCheetah-v5\nenv_backend: envpool\n")
    assert configs.load(str(path)).env == "envpool:HalfCheetah-v5"


def _old_run(config, **old_keys):
    """The run config that a release before env_backend chose the backend alone wrote."""
    return {**{key: value for key, value in config.items() if key != "env_backend"},
            **old_keys}


@pytest.mark.parametrize("old_keys, backend", [
    ({"env_processes": False, "env_backend": "local"}, "local"),
    ({"env_processes": True, "env_backend": "local"}, "processes"),
    ({"env_processes": True, "env_backend": "ray"}, "ray"),
    ({"env_processes": False}, "local"),  # Written before env_backend existed.
    ({"env_processes": True}, "processes"),
    ({"env": "envpool:Pendulum-v1", "env_processes": True, "env_backend": "local"}, "envpool"),
    ({"env": "envpool:Pendulum-v1", "env_processes": False, "env_backend": "local"},
     "envpool"),
])
def test_run_config_of_an_older_run_with_env_processes_loads(tmp_path, old_keys, backend):
    config = configs.load("pendulum", [f"env_backend={backend}"])
    path = tmp_path / "config.yaml"
    path.write_text(configs.dump(_old_run(config, **old_keys)))
    loaded = configs.read_run_config(path)
    assert "env_processes" not in loaded
    assert loaded == config


@pytest.mark.parametrize("name, module, old_module", [
    ("pendulum_dict", "batchrl.environments.nested_tasks", "batchrl.tools.nested_tasks"),
    ("pendulum_native", "batchrl.native_tasks", "batchrl.envs"),
])
def test_run_config_of_an_older_run_finds_the_tasks_where_they_moved(tmp_path, name, module,
                                                                      old_module):
    """An older run's `config.yaml` names its env's module by the old path; read, it is the
    shipped config's (so the run resumes with it, and renders)."""
    config = configs.load(name)
    assert config.env.startswith(module + ":")
    path = tmp_path / "config.yaml"
    old = config.env.replace(module + ":", old_module + ":")
    path.write_text(configs.dump({**config, "env": old}))
    assert configs.read_run_config(path) == config
    # A user's config still naming the old module reads the same, with a warning.
    with pytest.warns(DeprecationWarning, match=f"'env': {old} is now {config.env}"):
        assert configs.load(name, {"env": old}) == config


@pytest.mark.parametrize("name", configs.available())
def test_every_shipped_config_chooses_its_backend_with_env_backend_alone(name):
    from batchrl import environments

    yaml = ruamel.yaml.YAML(typ="safe", pure=True)
    raw = yaml.load(configs.CONFIG_DIR / f"{name}.yaml")
    assert "env_processes" not in raw
    assert not raw.get("env", "").startswith("envpool:")
    config = configs.load(name)
    assert config.env_backend == raw.get("env_backend", "processes")
    assert config.env.startswith("envpool:") == (config.env_backend == "envpool")
    environments.check_backend(config)


# A measured score in a comment: "eval 500", "eval return 1,625", "-174 at 1M steps",
# "19.8 of 20 at 40k". Figures live in docs/results.md, written by batchrl-benchmark.
SCORE = re.compile(r"eval(?: return)? [-−≥>=\s]*\d|\d at \d[\d.,]*[kM]\b|\d of \d+ at ")


@pytest.mark.parametrize("name", configs.available())
def test_shipped_config_comments_say_why_not_what_it_scored(name):
    text = (configs.CONFIG_DIR / f"{name}.yaml").read_text()
    comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    scores = [comment.strip() for comment in comments if SCORE.search(comment)]
    assert not scores, f"configs/{name}.yaml: {scores}"


def test_score_pattern_finds_the_scores_that_comments_once_held():
    for comment in ["eval return 1,625 at 1M steps", "eval -174 at 1M steps", "eval 500 after",
                    "eval >= -200 after 12k steps", "19.8 of 20 at 40k", "380 at 1M"]:
        assert SCORE.search(comment), comment
    assert not SCORE.search("updates: the target is the network of 500 steps ago")


# The presets of config key `network` (batchrl.networks.NETWORKS), and those that each
# off-policy algorithm builds, by hand: its networks are feed-forward MLPs of policy_layers
# and value_layers, which feed_forward_gaussian (the default) names, and dqn acts in Discrete
# action spaces, as feed_forward_categorical. The on-policy algorithms build every preset.
PRESETS = ("feed_forward_gaussian", "recurrent_gaussian", "feed_forward_categorical",
           "feed_forward_composite")
OFF_POLICY_TAKES = {"sac": ("feed_forward_gaussian",), "td3": ("feed_forward_gaussian",),
                    "dqn": ("feed_forward_gaussian", "feed_forward_categorical")}
ON_POLICY = ("ppo", "trpo", "a2c", "impala", "appo")
# The algorithms that build only some presets: the off-policy ones, and pqn (Q values
# in the categorical heads).
TAKES = {**OFF_POLICY_TAKES, "pqn": ("feed_forward_categorical", "feed_forward_composite")}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("algorithm", sorted(TAKES))
def test_algorithms_refuse_presets_they_do_not_build(algorithm, preset):
    overrides = {"algorithm": algorithm, "network": preset}
    takes = TAKES[algorithm]
    if preset in takes:
        assert configs.load("default", overrides).network == preset
        return
    with pytest.raises(configs.ConfigError) as error:
        configs.load("default", overrides)
    words = f"the preset{'s' if len(takes) > 1 else ''} {', '.join(takes)}"
    assert str(error.value) == (
        f"config key 'network': {algorithm} takes declared layers or {words}, not "
        f"'{preset}' (ppo, trpo, a2c, impala, appo take every preset)")


@pytest.mark.parametrize("name, algorithm", [
    ("pendulum_sac", "sac"), ("cheetah_sac_apex", "sac"), ("cheetah_td3", "td3"),
    ("cartpole_dqn", "dqn"), ("cartpole_apex", "dqn")])
def test_shipped_off_policy_configs_refuse_a_recurrent_preset_with_or_without_actors(
        name, algorithm):
    assert configs.load(name).algorithm == algorithm
    message = (f"config key 'network': {algorithm} takes declared layers or the preset")
    with pytest.raises(configs.ConfigError, match=re.escape(message)):
        configs.load(name, ["network=recurrent_gaussian"])
    layers = [{"type": "dense", "units": 8}]
    assert configs.load(name, {"network": layers}).network[0]["units"] == 8


@pytest.mark.parametrize("algorithm", ON_POLICY)
def test_on_policy_algorithms_take_every_preset(algorithm):
    for preset in PRESETS:
        assert configs.load("default", {"algorithm": algorithm, "network": preset}).network \
            == preset


def test_the_registry_agrees_with_the_algorithm_classes():
    """The registry (`batchrl.algorithms.registry`, read without TensorFlow) against the
    classes it names (TensorFlow): its families, the presets and recurrent layers each
    builds (the tables above, by hand), what its actors send (the on-policy algorithms'
    fragments, Ape-X's transitions), and the configs' algorithms."""
    from batchrl import build
    from batchrl.algorithms import registry
    from batchrl.algorithms.off_policy import OffPolicyAlgorithm
    from batchrl.algorithms.on_policy import OnPolicyAlgorithm
    from batchrl.networks import NETWORKS

    assert tuple(NETWORKS) == PRESETS == registry.PRESETS
    assert configs.ALGORITHMS == registry.NAMES == tuple(build.ALGORITHMS)
    for name, cls in build.ALGORITHMS.items():
        entry = registry.entry(name)
        assert cls.name == name and entry.load() is cls
        off = issubclass(cls, OffPolicyAlgorithm)
        assert off != issubclass(cls, OnPolicyAlgorithm)
        assert entry.family == ("off_policy" if off else "on_policy")
        assert entry.presets == TAKES.get(name, PRESETS)
        assert entry.recurrent == (name in ON_POLICY)
        assert entry.actors == cls.actors == ("transitions" if off else "fragments")
        assert registry.actors(name) == entry.actors


@pytest.mark.parametrize("algorithm", sorted(TAKES))
@pytest.mark.parametrize("recurrent", ["gru", "lstm"])
def test_a_recurrent_layer_off_policy_names_every_algorithm_that_takes_one(
        algorithm, recurrent):
    """`configs.load` refuses it, before anything is built, in one line."""
    with pytest.raises(configs.ConfigError) as error:
        configs.load("default", {"algorithm": algorithm, "network": [
            {"type": "dense", "units": 8}, {"type": recurrent, "units": 8}]})
    assert str(error.value) == (
        f"config key 'network': {algorithm} takes feed-forward layers (it learns from single "
        f"steps); a last {recurrent} layer needs ppo, trpo, a2c, impala or appo")
    for name in ON_POLICY:
        configs.load("default", {"algorithm": name, "network": [
            {"type": "dense", "units": 8}, {"type": recurrent, "units": 8}]})

"""Experiment configurations: YAML files under `configs/`, layered and validated.

A run's config is `configs/default.yaml`, overridden by a named config (`configs/NAME.yaml`)
or a YAML file given by path, overridden by `--set KEY=VALUE` pairs (values parsed as YAML).
Every key must exist in `default.yaml`, and every value must have the default's type.
"""

import copy
import difflib
import functools
import io
import os
import pathlib
import warnings

import ruamel.yaml

from batchrl.algorithms import registry
from batchrl.errors import ConfigError
from batchrl.networks import spec as network_spec
from batchrl.optimizers import spec as optimizer_spec

# An installed package carries the configs as batchrl/_configs; a source tree (also an
# editable install) has them in its top-level configs/.
CONFIG_DIR = pathlib.Path(__file__).resolve().parent / "_configs"
if not CONFIG_DIR.is_dir():
    CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"

# Constraints beyond the type of the default value.
_POSITIVE = {"num_agents", "steps", "eval_every", "log_every", "update_every",
             "update_epochs", "policy_lr", "value_lr", "kl_target", "kl_cutoff_factor",
             "init_std", "init_mean_factor", "max_length", "max_gradient_norm",
             "chunk_length", "batch_size", "worker_timeout", "steps_per_call",
             "num_workers", "observ_clip", "reward_clip", "worker_cpus", "replay_capacity",
             "updates_per_step", "n_step", "target_update_rate", "target_update_every",
             "init_temperature", "policy_delay", "rollout_length", "clip_ratio",
             "rho_bar", "c_bar", "envs_per_actor", "actor_cpus", "fragments_in_flight",
             "broadcast_every", "learners"}
_NON_NEGATIVE = {"eval_episodes", "kl_cutoff_coef", "kl_init_penalty", "seed",
                 "inter_op_threads", "entropy_coef", "value_coef", "worker_restarts",
                 "learning_starts", "target_noise", "target_noise_clip", "actors",
                 "max_policy_lag"}
_UNIT_INTERVAL = {"discount", "gae_lambda", "q_lambda", "target_update_rate"}
_OPTIONAL_INT = {"max_length", "chunk_length", "batch_size", "num_workers",
                 "inter_op_threads", "rollout_length", "target_update_every",
                 "max_policy_lag"}
_OPTIONAL_FLOAT = {"max_gradient_norm", "target_entropy", "clip_ratio", "target_update_rate"}
# Mappings or null, checked in full by the algorithm that reads them (build.check).
_OPTIONAL_MAPPING = {"prioritized_replay", "replay_frame_stack", "exploration"}
# The algorithms of the registry (`batchrl.algorithms.registry`); `module:NAME` names
# another algorithm class.
ALGORITHMS = registry.NAMES
_OPTIMIZERS = {"optimizer", "value_optimizer"}  # Declarations (batchrl/optimizers/spec.py).
_OPTIONAL_STR = {"ray_address"}
_CHOICES = {"kl_reference": ("behaviour", "update_start"),
            "recurrent_replay": ("unroll", "stepwise"),
            "activation": ("relu", "tanh"), "lr_schedule": ("constant", "linear"),
            "kl_schedule": ("constant", "linear"),
            "reward_normalizer": ("reward", "return"),
            "env_backend": ("local", "processes", "envpool", "ray")}
# The old spelling of an EnvPool task, `env: envpool:TASK`: env_backend envpool with env TASK.
ENVPOOL_PREFIX = "envpool:"
# Modules of environments that moved (read in old runs' configs): to batchrl.environments,
# and the native tasks' old name.
_MOVED_MODULES = {"batchrl.tools.nested_tasks": "batchrl.environments.nested_tasks",
                  "batchrl.tools.mock_environment": "batchrl.environments.mock",
                  "batchrl.envs": "batchrl.native_tasks"}
# Keys whose default became null (the algorithm's own), and the value every run of an older
# release saved: what null means for the algorithms but dqn (`_translate_old_run`).
_NULL_SINCE = {"target_update_rate": 0.005, "target_update_every": 1}
# Keys of older releases, and what replaced them (`_translate_old_keys`).
_REPLACED = {"env_processes": "env_backend: write env_backend: local (for false) or "
                              "env_backend: processes (for true)"}


class Config(dict):
    """A dict whose keys are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}") from None


def _yaml():
    yaml = ruamel.yaml.YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    return yaml


def _read(path):
    """The mapping that the YAML file `path` holds (a new copy at every call: the caller may
    change it); `{}` for an empty file.

    Raises:
      ConfigError: the file is not valid YAML, or holds something other than a mapping.
      OSError: the file cannot be read.
    """
    text = pathlib.Path(path).read_text()
    try:
        data = _parse(text)
    except ruamel.yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values")
    return copy.deepcopy(data)


@functools.lru_cache(maxsize=64)
def _parse(text):
    """YAML `text` parsed, once per text in this process: every `load` reads
    default.yaml, and the pure-Python parser took 29 ms of a `load`'s 30. Callers copy the
    result before changing it."""
    return _yaml().load(text)


def available():
    """Names of the configs under `configs/` (without `default`), sorted."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.yaml") if path.stem != "default")


def _suggest(word, choices):
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _resolve_path(name_or_path):
    if os.sep in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        path = pathlib.Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"config file {name_or_path} does not exist")
        return path
    path = CONFIG_DIR / f"{name_or_path}.yaml"
    if name_or_path == "default" or path.is_file():
        return path
    raise ConfigError(
        f"unknown config {name_or_path!r}{_suggest(name_or_path, available())}; "
        f"available: {', '.join(available())}")


def _check_value(key, value, default):
    """Checks the type and range of `value` for `key`; returns it (ints made floats)."""
    where = f"config key {key!r}"
    if key in _OPTIMIZERS:
        return _check_optimizer(key, value)
    if key == "algorithm":
        return _check_algorithm(value)
    if key == "network" and isinstance(value, list | dict):
        return network_spec.check_network(value)
    if key == "preprocessing":
        return network_spec.check_preprocessing(value)
    if value is None:
        if key in _OPTIONAL_INT or key in _OPTIONAL_FLOAT or key in _OPTIONAL_STR or (
                key in _OPTIONAL_MAPPING):
            return None
        raise ConfigError(f"{where} must not be null")
    if key in _OPTIONAL_MAPPING:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where} must be a mapping or null, got {value!r}")
        return value
    if key in _OPTIONAL_STR:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where} must be a non-empty string or null, got {value!r}")
        return value
    if key in _OPTIONAL_INT or isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
    elif key in _OPTIONAL_FLOAT or isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        value = float(value)
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
    elif isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where} must be a mapping of names to values, got {value!r}")
    elif isinstance(default, list):
        if not isinstance(value, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value):
            raise ConfigError(f"{where} must be a list of positive integers, got {value!r}")
    if key in _POSITIVE and value <= 0:
        raise ConfigError(f"{where} must be positive, got {value!r}")
    if key in _NON_NEGATIVE and value < 0:
        raise ConfigError(f"{where} must not be negative, got {value!r}")
    if key in _UNIT_INTERVAL and not 0 <= value <= 1:
        raise ConfigError(f"{where} must be between 0 and 1, got {value!r}")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(f"{where} is {value!r}; choices: {', '.join(_CHOICES[key])}")
    return value


def _check_optimizer(key, value):
    """A checked optimizer declaration with its defaults filled in, or None."""
    if value is None:
        return None
    try:
        return optimizer_spec.check(value, key)
    except ValueError as error:
        raise ConfigError(f"config key {error}") from None


def _check_algorithm(value):
    if not isinstance(value, str) or value not in ALGORITHMS and not (
            value.count(":") == 1 and all(value.split(":"))):
        raise ConfigError(
            f"config key 'algorithm' is {value!r}{_suggest(str(value), ALGORITHMS)}; "
            f"choices: {', '.join(ALGORITHMS)}, or module:NAME of an algorithm class")
    return value


def _check_network(config):
    """Checks config key `network` against what config key `algorithm` builds (its
    registry entry; an algorithm `module:NAME` is not checked): a preset it builds, or
    declared layers, whose last layer is a `gru` or `lstm` only for an algorithm that
    trains recurrent layers.

    Raises:
      ConfigError: one line naming the algorithm and what it takes, e.g. sac with
        `network: recurrent_gaussian`, which it would otherwise ignore.
    """
    network, entry = config["network"], registry.entry(config["algorithm"])
    if entry is None:
        return
    if not isinstance(network, list | dict):
        if network in entry.presets or network not in registry.PRESETS:
            return  # An unknown name is build.check's error (it names the choices).
        presets = entry.presets
        raise ConfigError(
            f"config key 'network': {entry.name} takes declared layers or the "
            f"preset{'s' if len(presets) > 1 else ''} {', '.join(presets)}, not {network!r} "
            f"({', '.join(registry.names(presets=registry.PRESETS))} take every preset)")
    listed = network if isinstance(network, list) else network.get("layers") or []
    last = listed[-1] if listed and isinstance(listed[-1], dict) else {}
    if last.get("type") in network_spec.RECURRENT and not entry.recurrent:
        recurrent = registry.names(recurrent=True)
        raise ConfigError(
            f"config key 'network': {entry.name} takes feed-forward layers (it learns from "
            f"single steps); a last {last['type']} layer needs "
            f"{', '.join(recurrent[:-1])} or {recurrent[-1]}")


def _translate_envpool_prefix(layer, source):
    """`layer` (one config layer: a file or the `--set` pairs) with its `env: envpool:TASK`
    written as `env: TASK` and `env_backend: envpool`.

    Raises:
      ConfigError: the same layer also sets `env_backend` to another backend.
    """
    env = layer.get("env")
    if not isinstance(env, str) or not env.startswith(ENVPOOL_PREFIX):
        return layer
    task = env[len(ENVPOOL_PREFIX):]
    backend = layer.get("env_backend", "envpool")
    if backend != "envpool":
        raise ConfigError(
            f"config keys 'env' ({env}) and 'env_backend' ({backend}) contradict each other "
            f"in {source}: write env: {task} and choose the backend with env_backend alone "
            f"(envpool for EnvPool's task {task})")
    return {**layer, "env": task, "env_backend": "envpool"}


def _merge(config, overrides, defaults, source):
    for key in overrides:
        if key in _REPLACED and key not in defaults:
            raise ConfigError(f"config key {key!r} in {source} is replaced by {_REPLACED[key]}")
    overrides = _translate_envpool_prefix(overrides, source)
    for key, value in overrides.items():
        if key not in defaults:
            raise ConfigError(
                f"unknown config key {key!r} in {source}{_suggest(key, defaults)}; "
                f"valid keys: {', '.join(sorted(defaults))}")
        config[key] = _check_value(key, value, defaults[key])


def parse_overrides(pairs):
    """Parses `KEY=VALUE` strings into a dict; values are YAML (`1e-4`, `[64, 64]`, `null`)."""
    result = {}
    for pair in pairs or ():
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            result[key.strip()] = copy.deepcopy(_parse(text)) if text.strip() else None
        except ruamel.yaml.YAMLError:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML") from None
    return result


def load(name_or_path="default", overrides=None):
    """Loads and validates a config.

    Args:
      name_or_path: a config name under `configs/` or a path to a YAML file.
      overrides: list of `KEY=VALUE` strings (or a dict), applied last.

    Returns:
      `Config`. With `env_backend: envpool`, its `env` is `envpool:TASK` (whether the files
      wrote `env: TASK` or the old `env: envpool:TASK`): the form the code reads.

    Raises:
      ConfigError: unknown config name, unknown key, wrong type or out-of-range value; a key
        of older releases (`env_processes`; the message names `env_backend`); `env:
        envpool:TASK` (the old spelling of `env: TASK` with `env_backend: envpool`, still
        read) with another `env_backend` in the same file or `--set` pairs; a preset
        `network` that the algorithm does not build, or a recurrent last layer for one that
        trains none (`_check_network`).
    """
    defaults = _read(CONFIG_DIR / "default.yaml")
    config = Config()
    _merge(config, defaults, defaults, "default.yaml")
    path = _resolve_path(name_or_path)
    _merge(config, _read(path), defaults, path.name)
    if not isinstance(overrides, dict):
        overrides = parse_overrides(overrides)
    _merge(config, overrides, defaults, "--set")
    _check_network(config)
    return _with_envpool_prefix(_with_moved_module(config))


def _with_moved_module(config):
    """`config` with an `env` of a module that moved (`_MOVED_MODULES`, e.g.
    `batchrl.envs:Pendulum`) written with its new module, and a DeprecationWarning: the one
    spelling the code compares (a resumed run's saved config is translated alike)."""
    env = config.get("env")
    for old, new in _MOVED_MODULES.items():
        if isinstance(env, str) and env.startswith(old + ":"):
            config["env"] = new + env[len(old):]
            warnings.warn(f"config key 'env': {env} is now {config['env']}", DeprecationWarning,
                          stacklevel=3)
    return config


def _with_envpool_prefix(config):
    """`config` with `env` written `envpool:TASK` when `env_backend` is envpool: the one form
    of an EnvPool task that the code reads (`environments.envpool_task`), in a loaded config
    and in a run's `config.yaml`, so that `env` alone tells an EnvPool task from the
    Gymnasium environment of the same id."""
    if config.get("env_backend") == "envpool" and not config["env"].startswith(ENVPOOL_PREFIX):
        config["env"] = ENVPOOL_PREFIX + config["env"]
    return config


def dump(config):
    """The config as YAML text, keys in the order of `default.yaml`."""
    stream = io.StringIO()
    _yaml().dump(dict(config), stream)
    return stream.getvalue()


def read_run_config(path):
    """Reads a run's `config.yaml` (written by `dump`); returns `Config`.

    Keys added to `default.yaml` after the run was written take their default values; the
    backend keys of older runs are translated (`_translate_old_run`), so that they still
    load, resume, render and export.
    """
    return _with_envpool_prefix(Config({**_read(CONFIG_DIR / "default.yaml"),
                                        **_translate_old_run(_read(path))}))


def _translate_old_run(saved):
    """A run's saved config with the keys of older releases written as today's:
    `env: envpool:TASK` with `env_backend: envpool`; `env_processes` (dropped)
    as `env_backend: processes` (true) or `local` (false), unless `env_backend` was `ray`;
    an `env` in a module that moved (`_MOVED_MODULES`) under its new module; the
    `target_update_rate: 0.005` and `target_update_every: 1` that every run saved before
    their default became null (`_NULL_SINCE`) as null, which means the same for every
    algorithm but dqn (a dqn run keeps them, as it trained with them)."""
    saved = dict(saved)
    if saved.get("algorithm") != "dqn":
        for key, value in _NULL_SINCE.items():
            if saved.get(key) == value:
                saved[key] = None
    for old, new in _MOVED_MODULES.items():  # Test tasks of an env `module:Class`.
        if isinstance(saved.get("env"), str) and saved["env"].startswith(old + ":"):
            saved["env"] = new + saved["env"][len(old):]
    processes = saved.pop("env_processes", None)
    env = saved.get("env")
    if isinstance(env, str) and env.startswith(ENVPOOL_PREFIX):
        saved["env_backend"] = "envpool"
    elif processes is not None and saved.get("env_backend", "local") == "local":
        saved["env_backend"] = "processes" if processes else "local"
    return saved

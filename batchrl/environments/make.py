"""Building the environments of a config. Free of TensorFlow: worker processes import it.

The config key `env` is either a Gymnasium id (`Pendulum-v1`), made with `gymnasium.make`,
or `module:attribute` naming a class or function that returns a `gymnasium.Env`, or
`module:ID` naming a module that registers the Gymnasium id `ID` when imported
(`batchrl.environments.minatar:MinAtar/Breakout-v1`; Gymnasium's own convention, for ids
that are not Python names); each is called with the keyword arguments `env_kwargs`. A
`module:attribute` may also name an in-graph batch environment class
(`batchrl.native_tasks:Pendulum`, marked by a true class attribute `in_graph`): the whole batch
is then one object built in this process, in TensorFlow, and `gymnasium_id` names its
Gymnasium equivalent (its time limit, its rendering).
The config key `env_backend` says where the environments step: `local` (a `BatchEnv` in
this process), `processes` (a `ParallelBatchEnv` of worker processes), `ray` (a
`batchrl.environments.ray.driver.RayBatchEnv` of Ray actors, which imports Ray when it is built), or
`envpool`: `env` is then an EnvPool task (`HalfCheetah-v5`, `CheetahRun-v1`), and the whole
batch is one `EnvPoolBatchEnv`, stepped by `num_workers` C++ threads in this process;
`env_kwargs` are then the task's EnvPool options, and may give `num_threads` and
`max_episode_steps` in place of `num_workers` and `max_length` (`envpool_settings`). A loaded
config writes such a task `envpool:TASK` (`configs.load`), the form `envpool_task` reads.
An in-graph environment steps in the graph with `local` or `processes` (the default).
"""

import difflib
import functools
import importlib
import importlib.util

import gymnasium as gym

from batchrl.environments import envpool as envpool_env
from batchrl.environments.local import BatchEnv
from batchrl.environments.processes import ParallelBatchEnv
from batchrl.environments.wrappers import standard_wrappers
from batchrl.errors import ConfigError

# The old spelling of an EnvPool task, the form a loaded config keeps (configs.ENVPOOL_PREFIX;
# configs imports nothing of this package, to load fast).
ENVPOOL_PREFIX = "envpool:"


def envpool_task(env):
    """The EnvPool task id of `env` = "envpool:TASK" (a loaded config's `env` with
    `env_backend: envpool`), or None for any other `env`."""
    return env[len(ENVPOOL_PREFIX):] if env.startswith(ENVPOOL_PREFIX) else None


def _check_envpool_task(task):
    try:
        envpool_env.check_task_id(task)
    except ImportError:
        raise ConfigError(f"config key 'env_backend' is envpool, for the task {task}, which "
                          f"needs EnvPool: pip install envpool") from None
    except ValueError as error:
        raise ConfigError(f"config key 'env': {error}") from None


def _import(module_name):
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"config key 'env': cannot import module {module_name!r} "
                          f"({error})") from None


def registered_id(env):
    """The Gymnasium id of a `module:ID` env (an `ID` that is not a Python name) after
    importing the module that registers it; None for any other env.

    Raises:
      ConfigError: the module cannot be imported, or does not register `ID` (the message
        names close registered ids).
    """
    module_name, _, name = env.partition(":")
    if not name or name.isidentifier() or envpool_task(env) is not None:
        return None
    _import(module_name)
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=5, cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ConfigError(f"config key 'env': module {module_name!r} registers no Gymnasium "
                          f"environment {name!r}{hint}")
    return name


def _resolve(env):
    """The callable named by `module:attribute`; raises ConfigError naming what is missing."""
    module_name, _, attribute = env.partition(":")
    module = _import(module_name)
    constructor = getattr(module, attribute, None)
    if not callable(constructor):
        raise ConfigError(f"config key 'env': module {module_name!r} has no class or "
                          f"function {attribute!r}")
    return constructor


def check_env_id(env):
    """Raises `ConfigError` for an unregistered id (naming close registered ids) or a
    `module:attribute` that cannot be imported, or an EnvPool task EnvPool does not have
    (naming close task ids)."""
    if envpool_task(env) is not None:
        _check_envpool_task(envpool_task(env))
        return
    if registered_id(env) is not None:
        return
    if ":" in env:
        _resolve(env)
        return
    if env in gym.registry:
        return
    close = difflib.get_close_matches(env, list(gym.registry), n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ConfigError(f"unknown Gymnasium environment id {env!r} (config key 'env'){hint}")


# Config keys that only the Ray backend reads, and their defaults.
_RAY_KEYS = {"ray_address": None, "worker_cpus": 1.0, "worker_restarts": 0}
# Those that the actors of the actor-learner mode (`actors` above 0) read too.
_ACTOR_KEYS = ("ray_address", "worker_restarts")


def check_backend(config):
    """Checks that `env_backend` agrees with the other keys (without importing Ray).

    Raises:
      ConfigError: `env_backend: envpool` with a `module:attribute` env; `env_backend: ray`
        with an in-graph environment (stepped in the graph, in this process) or without Ray
        installed; or a Ray-only key (`ray_address`, `worker_cpus`, `worker_restarts`) set
        with another backend (`ray_address` and `worker_restarts` also apply to `actors`).
    """
    if config.env_backend != "ray":
        for key, default in _RAY_KEYS.items():
            if config[key] != default and not (config.get("actors") and key in _ACTOR_KEYS):
                also = " or actors" if key in _ACTOR_KEYS else ""
                raise ConfigError(f"config key {key!r} ({config[key]!r}) applies only to "
                                  f"env_backend: ray{also}, and env_backend is "
                                  f"{config.env_backend}")
    task = envpool_task(config.env)
    if config.env_backend == "envpool" and (task is None or ":" in task):
        raise ConfigError(f"config key 'env_backend' is envpool, but env "
                          f"{task or config.env!r} is not an EnvPool task id (such as "
                          f"HalfCheetah-v5); choose env_backend local, processes or ray")
    if config.env_backend != "ray":
        return
    if native_class(config.env) is not None:
        raise ConfigError(f"config key 'env_backend' is ray, but env {config.env!r} is an "
                          f"in-graph environment, stepped in the graph: choose env_backend "
                          f"local or processes")
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("config key 'env_backend' is ray, which needs Ray: pip install "
                          "'batchrl[ray]'")


def native_class(env):
    """The in-graph batch environment class that `env` names (e.g. `batchrl.native_tasks:Pendulum`),
    or None for a Gymnasium id or a `module:attribute` building a `gymnasium.Env`.

    Imports the module of a `module:attribute` (TensorFlow for `batchrl.native_tasks`).
    """
    if ":" not in env or envpool_task(env) is not None or registered_id(env) is not None:
        return None
    constructor = _resolve(env)
    return constructor if getattr(constructor, "in_graph", False) is True else None


def gymnasium_id(env):
    """The Gymnasium environment that `env` is or stands for: `env` itself, the
    `gymnasium_id` of an in-graph environment class (to render it, for example), or the
    Gymnasium id of the same name as an EnvPool task (None where Gymnasium has none, as
    for the DeepMind Control tasks)."""
    task = envpool_task(env)
    if task is not None:
        return task if task in gym.registry else None
    native = native_class(env)
    return native.gymnasium_id if native else env


def episode_limit(config):
    """The maximal episode length: `max_length`, else the registered time limit (of the
    Gymnasium equivalent, for an in-graph environment; for an EnvPool task its option
    `max_episode_steps` in `env_kwargs`, else its own limit).

    Raises:
      ConfigError: when neither is set (always so for a `module:attribute` environment
        without `max_length`); for an EnvPool task, as `envpool_settings`.
    """
    task = envpool_task(config.env)
    if task is not None:
        return envpool_settings(config)[1]
    if config.max_length:
        return config.max_length
    env = registered_id(config.env) or gymnasium_id(config.env)
    limit = None if ":" in env else gym.spec(env).max_episode_steps
    if not limit:
        raise ConfigError(
            f"environment {config.env!r} has no registered time limit: set config key "
            f"'max_length'")
    return limit


# EnvPool options that config keys also set.
_ENVPOOL_KEYS = {"num_threads": "num_workers", "max_episode_steps": "max_length"}


def envpool_settings(config):
    """`(num_threads, max_episode_steps, options)` of the `EnvPoolBatchEnv` of a config with
    `env_backend: envpool`: `num_workers` or else `env_kwargs`' `num_threads` (None: one per
    core), `max_length` or else `env_kwargs`' `max_episode_steps` or else the task's own
    limit, and the other `env_kwargs`.

    Raises:
      ConfigError: an unknown task; `num_workers` and `num_threads`, or `max_length` and
        `max_episode_steps`, both set and different (the message names both keys); an
        option the task does not have or batchrl sets itself, or a value that is not an
        int >= 1 (the message names `env_kwargs`).
    """
    task = envpool_task(config.env)
    _check_envpool_task(task)
    options = dict(config.env_kwargs)
    for option, key in _ENVPOOL_KEYS.items():
        if option in options and config[key] is not None and options[option] != config[key]:
            raise ConfigError(f"config keys {key!r} ({config[key]}) and 'env_kwargs' "
                              f"({option}: {options[option]}) contradict each other: set "
                              f"only one of them")
    try:
        return envpool_env.resolve_options(
            task, config.num_workers, config.max_length or None, options)
    except ValueError as error:
        raise ConfigError(f"config key 'env_kwargs': {error}") from None


def create(env, max_episode_steps=None, render_mode=None, kwargs=None):
    """One environment with `standard_wrappers` (time limit, action range [-1, 1], float32
    observations, nested spaces flattened).

    Args:
      env: a Gymnasium id or `module:attribute`.
      max_episode_steps: the episode length limit, or None for the registered one.
      render_mode: passed to the environment (e.g. "rgb_array").
      kwargs: dict of keyword arguments for the environment.
    """
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if ":" in env and registered_id(env) is None:
        instance = _resolve(env)(**kwargs)
    else:
        instance = gym.make(env, **kwargs)  # Imports the module of a `module:ID`.
    return standard_wrappers(instance, max_episode_steps)


def create_batch(config):
    """The batch of a config: `config.num_agents` environments, with `env_backend: local` in
    this process, with `processes` in a `ParallelBatchEnv` of `config.num_workers` worker
    processes (None: one per core), each hosting a contiguous group of the environments;
    with `ray`, in a `RayBatchEnv` of `config.num_workers` Ray actors (None: one per
    `worker_cpus` CPUs of the Ray cluster) on the Ray of `config.ray_address`.

    The environments' random generators are seeded with `config.seed + index`. For an
    in-graph environment class (`native_class`), returns that class's instance for the
    whole batch, seeded with `config.seed` (`env_backend` local or processes); for
    `env_backend: envpool`, an `EnvPoolBatchEnv` with the settings of `envpool_settings`
    (threads: `config.num_workers`, else `env_kwargs`' `num_threads`, else one per core).

    Raises:
      ConfigError: `check_backend` or `envpool_settings` fails, or Ray cannot be started or
        reached at `config.ray_address` (the message names the key).
    """
    check_backend(config)
    task = envpool_task(config.env)
    if task is not None:
        num_threads, limit, options = envpool_settings(config)
        batch_env = envpool_env.EnvPoolBatchEnv(
            task, config.num_agents, num_threads=num_threads, seed=config.seed,
            max_episode_steps=limit, kwargs=options)
        batch_env.reset(seed=config.seed)
        return batch_env
    native = native_class(config.env)
    if native:
        return native(config.num_agents, max_episode_steps=episode_limit(config),
                      seed=config.seed, **config.env_kwargs)
    constructor = functools.partial(
        create, config.env, episode_limit(config), kwargs=config.env_kwargs)
    if config.env_backend == "ray":
        batch_env = _ray_batch(config, constructor)
    elif config.env_backend == "processes":
        batch_env = ParallelBatchEnv(constructor, config.num_agents,
                                     num_workers=config.num_workers,
                                     timeout=config.worker_timeout, name=config.env)
    else:
        envs = []
        for index in range(config.num_agents):
            try:
                envs.append(constructor())
            except Exception as error:
                for env in envs:
                    env.close()
                raise RuntimeError(f"env {index} ({config.env}): the constructor raised "
                                   f"{type(error).__name__}: {error}") from error
        batch_env = BatchEnv(envs, blocking=True)
    try:
        batch_env.reset(seed=config.seed)
    except BaseException:
        batch_env.close()
        raise
    return batch_env


def _ray_batch(config, constructor):
    from batchrl.environments.ray import driver as ray_env

    try:
        return ray_env.RayBatchEnv(
            constructor, config.num_agents, num_workers=config.num_workers,
            worker_cpus=config.worker_cpus, timeout=config.worker_timeout,
            restarts=config.worker_restarts, address=config.ray_address, name=config.env)
    except ray_env.RayUnavailable as error:
        raise ConfigError(f"config key 'ray_address' ({config.ray_address!r}): "
                          f"{error}") from None
    except ray_env.NotEnoughCPUs as error:
        raise ConfigError(f"config keys 'num_workers' and 'worker_cpus': {error}") from None

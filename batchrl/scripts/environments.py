"""Building the environments of a config. Free of TensorFlow: worker processes import it."""

import difflib
import functools

import gymnasium as gym

from batchrl.scripts.configs import ConfigError
from batchrl.tools.batch_env import BatchEnv
from batchrl.tools.wrappers import ExternalProcess, standard_wrappers


def check_env_id(env_id):
    """Raises `ConfigError` naming close registered ids when `env_id` is not registered."""
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ConfigError(f"unknown Gymnasium environment id {env_id!r} (config key 'env'){hint}")


def episode_limit(config):
    """The maximal episode length: `max_length`, else the environment's own time limit.

    Raises:
      ConfigError: when neither is set.
    """
    if config.max_length:
        return config.max_length
    limit = gym.spec(config.env).max_episode_steps
    if not limit:
        raise ConfigError(
            f"environment {config.env!r} has no time limit: set config key 'max_length'")
    return limit


def create(env_id, max_episode_steps=None, render_mode=None):
    """One environment with `standard_wrappers` (time limit, action range [-1, 1], float32)."""
    return standard_wrappers(gym.make(env_id, render_mode=render_mode), max_episode_steps)


def create_batch(config, num_agents=None):
    """The `BatchEnv` of a config: `num_agents` environments (default `config.num_agents`),
    in worker processes when `config.env_processes`, else in this process.

    The environments' random generators are seeded with `config.seed + index`.
    """
    num_agents = num_agents or config.num_agents
    constructor = functools.partial(create, config.env, episode_limit(config))
    if config.env_processes:
        envs = []
        try:
            for index in range(num_agents):
                envs.append(ExternalProcess(constructor, name=f"env {index} ({config.env})"))
        except BaseException:
            for env in envs:
                env.close()
            raise
        batch_env = BatchEnv(envs, blocking=False)
    else:
        batch_env = BatchEnv([constructor() for _ in range(num_agents)], blocking=True)
    batch_env.reset(seed=config.seed)
    return batch_env

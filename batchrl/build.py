"""Building the algorithm of a config: the in-graph environment, BatchPPO and its checkpoint
(shared by `train`, `visualize`, `export` and `batchrl.Agent`)."""

import collections

import keras
import tensorflow as tf

from batchrl import configs, environments
from batchrl.algorithms.ppo import PPO
from batchrl.networks import NETWORKS
from batchrl.tools.in_graph_batch_env import InGraphBatchEnv

Built = collections.namedtuple(
    "Built", "batch_env, algo, step, is_training, should_log, checkpoint")


def check(config):
    """Checks what the config names against the registries.

    Raises:
      ConfigError: unknown environment id or network, or no episode length limit.
    """
    environments.check_env_id(config.env)
    if config.network not in NETWORKS:
        raise configs.ConfigError(
            f"unknown network {config.network!r} (config key 'network'); "
            f"choices: {', '.join(sorted(NETWORKS))}")
    environments.episode_limit(config)


def build(config, batch_env):
    """The agent of `config` acting in `batch_env`.

    Seeds Keras (network initialization) with `config.seed`, wraps `batch_env` in an
    `InGraphBatchEnv` (unless it is an in-graph environment of `batchrl.envs`), and builds
    BatchPPO with a global step (int64, training environment steps) and the `is_training` /
    `should_log` variables.

    Args:
      config: a validated `Config`.
      batch_env: a `BatchEnv` of the config's environment, or an in-graph environment
        (`environments.create_batch` returns either).

    Returns:
      `Built`; its `checkpoint` (`tf.train.Checkpoint`) holds the step and everything that
      defines training (`algo.checkpoint_state`).

    Raises:
      ConfigError: the config's network does not fit the spaces of `batch_env`.
    """
    keras.utils.set_random_seed(config.seed)
    if getattr(batch_env, "in_graph", False) is True:
        in_graph = batch_env
    else:
        in_graph = InGraphBatchEnv(batch_env)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    is_training = tf.Variable(True, trainable=False, name="is_training")
    should_log = tf.Variable(True, trainable=False, name="should_log")
    algo_config = configs.Config(config)
    algo_config["network"] = NETWORKS[config.network]
    algo_config["max_length"] = environments.episode_limit(config)
    try:
        algo = PPO(in_graph, step, is_training, should_log, algo_config)
    except ValueError as error:  # The networks check the spaces they are built for.
        raise configs.ConfigError(
            f"config key 'network' is {config.network!r}: {error}") from None
    checkpoint = tf.train.Checkpoint(step=step, **algo.checkpoint_state)
    return Built(in_graph, algo, step, is_training, should_log, checkpoint)

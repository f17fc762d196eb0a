"""NumPy references for the update tests of the on-policy algorithms with a Gaussian
policy (TRPO, A2C, IMPALA): the policy's parameters read out, the log-density and KL of
diagonal Gaussians; and the tests' algorithm on two mock environments."""

import math

import numpy as np
import tensorflow as tf

from batchrl import configs
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.networks import feed_forward_gaussian


def algorithm_on_mocks(algorithm, settings, max_length):
    """`algorithm` built with the default config and `settings` (key -> value) on two mock
    environments (observations `(3,)`, actions `(2,)`, episodes of 2 to `max_length`
    steps), with the same initial weights in every call."""
    tf.keras.utils.set_random_seed(0)
    config = configs.load("default", settings)
    config.update(network=feed_forward_gaussian, max_length=max_length)
    envs = [MockEnvironment((3,), (2,), 2, max_length) for _ in range(2)]
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    return algorithm(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
                     tf.Variable(False), config)


def params(networks, observ):
    """The policy's mean and log standard deviation on `observ` (two rows), NumPy."""
    params, _ = networks.policy(observ, np.zeros((2, 0), np.float32))
    return params["mean"].numpy(), np.broadcast_to(params["logstd"].numpy(),
                                                   params["mean"].shape)


def log_prob(action, mean, logstd):
    """Log-density of a diagonal Gaussian, summed over the action's dimensions, NumPy."""
    z = (action - mean) / np.exp(logstd)
    return np.sum(-0.5 * z ** 2 - logstd - 0.5 * math.log(2 * math.pi), -1)


def entropy(logstd):
    """Entropy of a diagonal Gaussian, summed over the action's dimensions, NumPy."""
    return np.sum(logstd + 0.5 * math.log(2 * math.pi * math.e), -1)


def kl(mean, logstd, other_mean, other_logstd):
    """KL(p || q) of diagonal Gaussians, summed over the action's dimensions, NumPy."""
    return np.sum(other_logstd - logstd + (np.exp(2 * logstd) + (mean - other_mean) ** 2)
                  / (2 * np.exp(2 * other_logstd)) - 0.5, -1)

"""Action distributions of policies, built from the parameters a policy network outputs.

A distribution is constructed from a dict of float32 tensors (the network's output, with
any leading batch and time dimensions) and offers `sample`, `mode`, `log_prob`, `entropy`
and `kl`. Storing that dict is enough to rebuild the old policy during a PPO update.
"""

import math

import tensorflow as tf


class DiagonalGaussian:
    """Gaussian with diagonal covariance over the last dimension.

    Args:
      params: dict with `mean` and `logstd`, float32 tensors of shape `[..., action_size]`;
        `logstd` is the natural log of the standard deviation.
    """

    param_names = ("mean", "logstd")

    def __init__(self, params):
        self.mean = tf.convert_to_tensor(params["mean"], tf.float32)
        self.logstd = tf.broadcast_to(
            tf.convert_to_tensor(params["logstd"], tf.float32), tf.shape(self.mean))

    def sample(self, generator):
        """Draws one action per distribution with a `tf.random.Generator`; `[..., size]`."""
        noise = generator.normal(tf.shape(self.mean), dtype=tf.float32)
        return self.mean + tf.exp(self.logstd) * noise

    def mode(self):
        """The most likely action, the mean; `[..., size]`."""
        return self.mean

    def log_prob(self, action):
        """Log density of `action` (`[..., size]`), summed over the action dimensions; `[...]`."""
        z = (tf.cast(action, tf.float32) - self.mean) * tf.exp(-self.logstd)
        per_dim = -0.5 * tf.square(z) - self.logstd - 0.5 * math.log(2 * math.pi)
        return tf.reduce_sum(per_dim, -1)

    def entropy(self):
        """Differential entropy in nats, `sum(logstd + 0.5 * log(2 pi e))`; `[...]`."""
        return tf.reduce_sum(self.logstd + 0.5 * math.log(2 * math.pi * math.e), -1)

    def kl(self, other):
        """KL(self || other) in nats; `[...]`.

        For diagonal Gaussians p, q, per dimension:
        log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2.
        """
        variance = tf.exp(2 * self.logstd)
        other_variance = tf.exp(2 * other.logstd)
        per_dim = (other.logstd - self.logstd
                   + (variance + tf.square(self.mean - other.mean)) / (2 * other_variance)
                   - 0.5)
        return tf.reduce_sum(per_dim, -1)


class Categorical:
    """Distribution over `n` discrete actions.

    Args:
      params: dict with `logits`, float32 `[..., n]` unnormalized log-probabilities.
    Actions are int32 `[...]` in `[0, n)`.
    """

    param_names = ("logits",)

    def __init__(self, params):
        self.logits = tf.convert_to_tensor(params["logits"], tf.float32)
        self._log_probs = tf.nn.log_softmax(self.logits)

    def sample(self, generator):
        """Draws one action per distribution (Gumbel-max trick) with a `tf.random.Generator`."""
        uniform = generator.uniform(tf.shape(self.logits), minval=1e-20, maxval=1.0)
        gumbel = -tf.math.log(-tf.math.log(uniform))
        return tf.argmax(self.logits + gumbel, -1, output_type=tf.int32)

    def mode(self):
        """The most likely action; int32 `[...]`."""
        return tf.argmax(self.logits, -1, output_type=tf.int32)

    def log_prob(self, action):
        """Log-probability of the int actions `[...]`; float32 `[...]`."""
        action = tf.cast(action, tf.int32)
        return tf.gather(self._log_probs, action, batch_dims=len(action.shape))

    def entropy(self):
        """Entropy in nats, `-sum(p log p)`; `[...]`."""
        return -tf.reduce_sum(tf.exp(self._log_probs) * self._log_probs, -1)

    def kl(self, other):
        """KL(self || other) = `sum(p (log p - log q))` in nats; `[...]`."""
        return tf.reduce_sum(
            tf.exp(self._log_probs) * (self._log_probs - other._log_probs), -1)

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


class MultiCategorical(Categorical):
    """Independent categorical distributions over `k` choices, one action per choice.

    Args:
      params: dict with `logits`, float32 `[..., k, n]`; a choice with fewer than `n`
        actions has very negative logits (e.g. -1e9) for the actions it lacks, which then
        have probability 0.
    Actions are int32 `[..., k]`, each in `[0, n)`; log-probabilities, entropies and KL
    divergences are summed over the `k` choices.
    """

    def log_prob(self, action):
        """Log-probability of the int actions `[..., k]`, summed over the choices; `[...]`."""
        return tf.reduce_sum(super().log_prob(action), -1)

    def entropy(self):
        """Entropy in nats, summed over the choices; `[...]`."""
        return tf.reduce_sum(super().entropy(), -1)

    def kl(self, other):
        """KL(self || other) in nats, summed over the choices; `[...]`."""
        return tf.reduce_sum(super().kl(other), -1)


class Bernoulli:
    """Independent Bernoulli distributions over the last dimension (binary actions).

    Args:
      params: dict with `logits`, float32 `[..., size]`: `log(p / (1 - p))`, p the
        probability of 1.
    Actions are float32 `[..., size]`, each 0 or 1; log-probabilities, entropies and KL
    divergences are summed over the last dimension.
    """

    param_names = ("logits",)

    def __init__(self, params):
        self.logits = tf.convert_to_tensor(params["logits"], tf.float32)

    def sample(self, generator):
        """Draws one action per distribution with a `tf.random.Generator`; `[..., size]`."""
        uniform = generator.uniform(tf.shape(self.logits))
        return tf.cast(uniform < tf.sigmoid(self.logits), tf.float32)

    def mode(self):
        """The most likely action (1 where p > 1/2); float32 `[..., size]`."""
        return tf.cast(self.logits > 0, tf.float32)

    def log_prob(self, action):
        """Log-probability of `action` (`[..., size]`, 0 or 1), `sum(a l - softplus(l))`
        for logits l; `[...]`."""
        action = tf.cast(action, tf.float32)
        return tf.reduce_sum(action * self.logits - tf.nn.softplus(self.logits), -1)

    def entropy(self):
        """Entropy in nats, `sum(softplus(l) - p l)`; `[...]`."""
        return tf.reduce_sum(
            tf.nn.softplus(self.logits) - tf.sigmoid(self.logits) * self.logits, -1)

    def kl(self, other):
        """KL(self || other) in nats, `sum(p (log p - log q) + (1 - p) (log(1 - p) -
        log(1 - q)))`, with log p = -softplus(-l) and log(1 - p) = -softplus(l); `[...]`."""
        p = tf.sigmoid(self.logits)
        return tf.reduce_sum(
            p * (tf.nn.softplus(-other.logits) - tf.nn.softplus(-self.logits))
            + (1.0 - p) * (tf.nn.softplus(other.logits) - tf.nn.softplus(self.logits)), -1)


class Composite:
    """Independent distributions over the parts of one flat float32 action vector: the joint
    (product) distribution of a nested action space's leaves, one component per leaf.

    The log-probability, the entropy and the KL divergence of independent components are the
    sums of the components' (the chain rule of entropy and of KL divergence for independent
    variables, e.g. Cover and Thomas, "Elements of Information Theory", 2.5).

    Args:
      params: dict of float32 tensors with leading dimensions `[...]`: the parameters of
        component `name` under `name + "_" + parameter` (e.g. `leaf0_mean`, `leaf1_logits`).
      components: sequence of `(name, distribution class, size)`: the class
        (`DiagonalGaussian`, `MultiCategorical`, `Bernoulli`) and the number of consecutive
        elements of the flat action that its actions occupy, in order.

    Actions are float32 `[..., sum(sizes)]`: the components' actions, integer ones as floats,
    concatenated in order. Build the distribution of a policy with
    `functools.partial(Composite, components=...)`.
    """

    def __init__(self, params, components):
        self.components = tuple(components)
        self.parts = []
        for name, distribution, _ in self.components:
            prefix = name + "_"
            self.parts.append(distribution({
                key[len(prefix):]: value for key, value in params.items()
                if key.startswith(prefix)}))
        self._sizes = [size for _, _, size in self.components]

    def sample(self, generator):
        """Draws one action per distribution with a `tf.random.Generator`; float32
        `[..., size]`."""
        return self._join([part.sample(generator) for part in self.parts])

    def mode(self):
        """The most likely action of each component; float32 `[..., size]`."""
        return self._join([part.mode() for part in self.parts])

    def log_prob(self, action):
        """Log-probability of `action` (float `[..., size]`): the components' sum; `[...]`."""
        action = tf.cast(action, tf.float32)
        pieces = tf.split(action, self._sizes, axis=-1)
        return tf.add_n([
            part.log_prob(tf.cast(tf.round(piece), tf.int32) if isinstance(part, Categorical)
                          else piece)
            for part, piece in zip(self.parts, pieces, strict=True)])

    def entropy(self):
        """Entropy in nats, the components' sum; `[...]`."""
        return tf.add_n([part.entropy() for part in self.parts])

    def kl(self, other):
        """KL(self || other) in nats, the components' sum; `[...]`."""
        return tf.add_n([part.kl(theirs)
                         for part, theirs in zip(self.parts, other.parts, strict=True)])

    @staticmethod
    def _join(actions):
        return tf.concat([tf.cast(action, tf.float32) for action in actions], -1)

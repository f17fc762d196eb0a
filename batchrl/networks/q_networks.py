"""The networks of the off-policy algorithms: action-value functions (twin Q for SAC and
TD3, a Q head per discrete action for DQN) and their actors.

Observations arrive flattened, float32 `[batch, observation_size]` (nested observations as
`batchrl.spaces.nested` flattens them); continuous actions are float32 `[batch,
action_size]` in [-1, 1] (the wrappers map a bounded `Box` onto it).
"""

import keras
import tensorflow as tf

from batchrl.networks.built_by_call import BuiltByCall
from batchrl.networks.mlp import MLP, dense_layers

# Bounds of the actor's log standard deviation (those of Haarnoja et al.'s reference code):
# wide enough never to bind in practice, narrow enough to keep exp() finite.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def _mlp(units, activation):
    """The hidden layers of an actor or a Q network: `[batch, ...] -> [batch, units[-1]]`."""
    return MLP(dense_layers(units, activation), batch_dims=1, name="hidden")


def _flat(observ):
    observ = tf.convert_to_tensor(observ, tf.float32)
    return tf.reshape(observ, [tf.shape(observ)[0], -1])


class _StackedDense(keras.layers.Layer):
    """`heads` independent dense layers applied at once: `[heads, batch, in] -> [heads,
    batch, units]`, one batched matrix product (twin Q functions cost one op, not two)."""

    def __init__(self, heads, units, activation=None, name=None):
        super().__init__(name=name)
        self._heads, self._units = heads, units
        self._activation = keras.activations.get(activation)

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        limit = (6.0 / (fan_in + self._units)) ** 0.5  # Glorot uniform, per head.
        self.kernel = self.add_weight(
            shape=(self._heads, fan_in, self._units), name="kernel",
            initializer=keras.initializers.RandomUniform(-limit, limit))
        self.bias = self.add_weight(shape=(self._heads, 1, self._units), name="bias",
                                    initializer="zeros")

    def call(self, inputs):
        return self._activation(tf.matmul(inputs, self.kernel) + self.bias)


class TwinQ(BuiltByCall, keras.Model):
    """`heads` action-value functions Q_i(s, a), MLPs on the concatenated observation and
    action (Fujimoto et al. 2018, arXiv:1802.09477, section 4.2: clipped double Q).

    Called as `q(observ, action)` with observ `[batch, ...]` and action float32 `[batch,
    action_size]`; returns float32 `[heads, batch]`.

    With `torsos`, each Q function first maps the observation through its own torso (a
    declared network's layers, e.g. convolutions) and takes the torso's output, concatenated
    with the action, into its hidden layers.

    Args:
      units: sizes of the hidden layers.
      activation: of the hidden layers.
      heads: number of Q functions (2 for the twin Q of SAC and TD3).
      torsos: None, or `heads` layers of `[batch, time, *observation_shape] -> [batch,
        time, n]` (`batchrl.networks.torso.Torso`), one per Q function.
    """

    def __init__(self, units, activation="relu", heads=2, name="q", torsos=None):
        super().__init__(name=name)
        self.heads = heads
        self._torsos = torsos is not None
        if torsos is not None:
            if len(torsos) != heads:
                raise ValueError(f"TwinQ: {len(torsos)} torsos for {heads} heads")
            for index, torso in enumerate(torsos):  # Attributes: tracked for checkpoints.
                setattr(self, f"_torso{index}", _PerStep(torso, name=f"torso{index}"))
        for index, size in enumerate(units):
            setattr(self, f"_hidden{index}",
                    _StackedDense(heads, size, activation, name=f"hidden{index}"))
        self._depth = len(units)
        self._output = _StackedDense(heads, 1, name="output")

    def call(self, observ, action):
        action = tf.cast(action, tf.float32)
        if not self._torsos:
            inputs = tf.concat([_flat(observ), action], -1)
            hidden = tf.broadcast_to(inputs[None],
                                     tf.concat([[self.heads], tf.shape(inputs)], 0))
        else:
            features = tf.stack([getattr(self, f"_torso{index}")(observ)
                                 for index in range(self.heads)])
            actions = tf.broadcast_to(action[None], tf.concat(
                [[self.heads], tf.shape(action)], 0))
            hidden = tf.concat([features, actions], -1)
        for index in range(self._depth):
            hidden = getattr(self, f"_hidden{index}")(hidden)
        return self._output(hidden)[..., 0]


class SquashedGaussianActor(BuiltByCall, keras.Model):
    """The actor of SAC: a Gaussian over pre-squashing actions u, `a = tanh(u)` (Haarnoja
    et al. 2018, arXiv:1812.05905, appendix C).

    Called as `actor(observ)`; returns `(mean, log_std)`, float32 `[batch, action_size]`
    each, of u (log_std clipped to [LOG_STD_MIN, LOG_STD_MAX]).

    Args:
      action_size: number of action dimensions.
      units: sizes of the hidden layers.
      activation: of the hidden layers.
      hidden: None, or a layer to use instead of the MLP, as for `QNetwork`.
    """

    state_size = 0

    def __init__(self, action_size, units, activation="relu", name="actor", hidden=None):
        super().__init__(name=name)
        self._hidden = _mlp(units, activation) if hidden is None else _PerStep(hidden)
        self._mean = keras.layers.Dense(action_size, name="mean")
        self._log_std = keras.layers.Dense(action_size, name="log_std")

    def call(self, observ):
        hidden = self._hidden(observ)
        log_std = tf.clip_by_value(self._log_std(hidden), LOG_STD_MIN, LOG_STD_MAX)
        return self._mean(hidden), log_std


def squashed_sample(mean, log_std, noise):
    """A tanh-squashed Gaussian action and its log-density.

    With u = mean + exp(log_std) * noise and a = tanh(u), log pi(a) = log N(u; mean, std)
    - sum_i log(1 - tanh(u_i)^2) (Haarnoja et al. 2018, arXiv:1812.05905, appendix C, eq.
    26), the last term computed as 2 (log 2 - u - softplus(-2 u)), which stays finite where
    tanh(u) rounds to +-1.

    Args:
      mean, log_std: float32 `[batch, action_size]`.
      noise: float32 `[batch, action_size]`, standard normal draws.

    Returns:
      `(action, log_prob)`: float32 `[batch, action_size]` in (-1, 1) and `[batch]`.
    """
    u = mean + tf.exp(log_std) * noise
    gaussian = -0.5 * tf.square(noise) - log_std - 0.5 * tf.math.log(2.0 * 3.141592653589793)
    correction = 2.0 * (tf.math.log(2.0) - u - tf.nn.softplus(-2.0 * u))
    return tf.tanh(u), tf.reduce_sum(gaussian - correction, -1)


class DeterministicActor(BuiltByCall, keras.Model):
    """The actor of TD3: `a = tanh(MLP(observ))`, float32 `[batch, action_size]` in
    [-1, 1] (Fujimoto et al. 2018, arXiv:1802.09477, appendix C).

    Args:
      action_size, units, activation, hidden: as for `SquashedGaussianActor`.
    """

    state_size = 0

    def __init__(self, action_size, units, activation="relu", name="actor", hidden=None):
        super().__init__(name=name)
        self._hidden = _mlp(units, activation) if hidden is None else _PerStep(hidden)
        self._output = keras.layers.Dense(action_size, activation="tanh", name="action")

    def call(self, observ):
        return self._output(self._hidden(observ))


class _PerStep(BuiltByCall, keras.layers.Layer):
    """A layer of `[batch, time, *shape] -> [batch, time, n]` (a declared network's
    `batchrl.networks.torso.Torso`) applied to `[batch, *shape]`, a time axis of one step added and
    removed."""

    def __init__(self, layer, name="hidden"):
        super().__init__(name=name)
        self._layer = layer

    def call(self, observ):
        return self._layer(tf.convert_to_tensor(observ)[:, None])[:, 0]


class QNetwork(BuiltByCall, keras.Model):
    """Q(s, .) of DQN: one output per discrete action, float32 `[batch, num_actions]`.

    With `dueling`, two streams share the hidden layers: Q = V + A - mean(A) (Wang et al.
    2016, "Dueling Network Architectures for Deep Reinforcement Learning", eq. 9).

    Args:
      num_actions: int, the number of discrete actions.
      units: sizes of the hidden layers.
      activation: of the hidden layers.
      dueling: bool.
      hidden: None, or a layer of `[batch, time, *observation_shape] -> [batch, time, n]`
        to use instead of the MLP (a declared network's torso: its preprocessing and
        layers, e.g. convolutions on uint8 frames).
    """

    state_size = 0

    def __init__(self, num_actions, units, activation="relu", dueling=False, name="q",
                 hidden=None):
        super().__init__(name=name)
        self._hidden = _mlp(units, activation) if hidden is None else _PerStep(hidden)
        self._dueling = dueling
        self._advantage = keras.layers.Dense(num_actions, name="advantage")
        if dueling:
            self._value = keras.layers.Dense(1, name="value")

    def call(self, observ):
        hidden = self._hidden(observ)
        advantage = self._advantage(hidden)
        if not self._dueling:
            return advantage
        return self._value(hidden) + advantage - tf.reduce_mean(advantage, -1, keepdims=True)

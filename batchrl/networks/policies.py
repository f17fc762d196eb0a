"""The Keras models of the policies and the value network, and their heads: what
`batchrl.networks.constructors` build (presets and declared layers alike).

Every policy is called as `policy(observ, state)` with observations `[batch, time,
*observation_shape]` and the recurrent state at the first step, float32 `[batch,
state_size]`, and returns `(params, state)`: a dict of distribution parameters, each
`[batch, time, ...]`, and the state after the last step (feed-forward policies have
`state_size` 0 and pass the empty state through). `policy(observ, state, reset=reset)`
with bool `reset` `[batch, time]` zeroes a recurrent policy's state before the steps that
begin an episode (`batchrl.networks.recurrence.unroll`): rows that run across episode ends
are replayed as they were acted. `ValueNetwork` maps the same
observations to float32 `[batch, time]`.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from batchrl.networks.built_by_call import BuiltByCall
from batchrl.networks.mlp import MLP, dense_layers
from batchrl.networks.recurrence import unroll


def _run_hidden(layer, observ, state, reset=None):
    """`(hidden, state)`: the hidden layer's output and the next recurrent state; a
    feed-forward layer (no `state_size`) passes the state through. A recurrent one zeroes
    the state before the steps where `reset` (bool `[batch, time]`, or None) is True."""
    if getattr(layer, "state_size", 0):
        return layer(observ, state) if reset is None else layer(observ, state, reset=reset)
    return layer(observ), state


def _tracked(owner, prefix, layers):
    """Returns `layers` as a tuple after setting each as the attribute `_{prefix}{i}` of
    `owner`: Keras 3 layers do not expose the layers of a list attribute to
    `tf.train.Checkpoint`, so a checkpoint of the model alone would leave them out."""
    for index, layer in enumerate(layers):
        setattr(owner, f"_{prefix}{index}", layer)
    return tuple(layers)


def _mlp(units, activation, orthogonal, name):
    return MLP(dense_layers(units, activation, orthogonal), batch_dims=2, name=name)


class _GaussianHead(BuiltByCall, keras.layers.Layer):
    """`mean = tanh(W h + b)` and a learned, observation-independent log standard deviation.

    The mean layer is initialized small (`init_mean_factor`) so that the initial mean is
    near zero; the standard deviation starts at `init_std`.
    """

    def __init__(self, action_size, init_std, init_mean_factor, name="gaussian"):
        super().__init__(name=name)
        self._mean = keras.layers.Dense(
            action_size, kernel_initializer=keras.initializers.VarianceScaling(
                scale=init_mean_factor, mode="fan_avg", distribution="uniform"), name="mean")
        self._logstd = self.add_weight(
            shape=(action_size,), initializer=keras.initializers.Constant(math.log(init_std)),
            name="logstd")

    def call(self, hidden):
        mean = tf.tanh(self._mean(hidden))
        return {"mean": mean, "logstd": tf.broadcast_to(self._logstd, tf.shape(mean))}


class GaussianPolicy(BuiltByCall, keras.Model):
    """Feed-forward Gaussian policy of Hafner et al. (arXiv:1709.02878, section 4).

    `mean = tanh(W h(observ) + b)` with a ReLU MLP `h`, and a learned log standard deviation
    that does not depend on the observation.

    Args:
      action_size: number of action dimensions.
      units: sizes of the hidden layers.
      init_std: initial standard deviation (> 0).
      init_mean_factor: scale of the variance-scaling initializer of the mean layer.
      activation, orthogonal: of the hidden layers, as in `dense_layers`.
      hidden: a layer to use instead of the MLP (e.g. a declared `batchrl.networks.torso.Torso`),
        mapping `[batch, time, *observation_shape]` to `[batch, time, n]`; or, with a
        `state_size` (`batchrl.networks.torso.RecurrentTorso`), `(observ, state)` to `(hidden,
        state)`, which makes the policy recurrent (its `state_size`).
    """

    def __init__(self, action_size, units, init_std, init_mean_factor, activation="relu",
                 orthogonal=False, name="policy", hidden=None):
        super().__init__(name=name)
        self._hidden = hidden if hidden is not None else _mlp(
            units, activation, orthogonal, name="hidden")
        self.state_size = int(getattr(self._hidden, "state_size", 0))
        self._head = _GaussianHead(action_size, init_std, init_mean_factor)

    def call(self, observ, state, reset=None):
        hidden, state = _run_hidden(self._hidden, observ, state, reset)
        return self._head(hidden), state


class RecurrentGaussianPolicy(BuiltByCall, keras.Model):
    """Gaussian policy with a GRU between the observation encoder and the head.

    `h_t = GRU(encoder(observ_t), h_{t-1})` with a ReLU MLP encoder (`units[:-1]`) and a
    Keras `GRUCell` of `units[-1]` units; the mean and log standard deviation are as in
    `GaussianPolicy`, computed from `h_t`. The state is `h`, float32 `[batch, units[-1]]`,
    zero at the start of an episode.

    Args:
      action_size: number of action dimensions.
      units: sizes of the encoder layers followed by the size of the GRU (at least one).
      init_std, init_mean_factor: as in `GaussianPolicy`.
      activation, orthogonal: of the encoder layers, as in `dense_layers`.
    """

    def __init__(self, action_size, units, init_std, init_mean_factor, activation="relu",
                 orthogonal=False, name="policy"):
        super().__init__(name=name)
        if not units:
            raise ValueError("recurrent_gaussian needs at least one layer size (the GRU)")
        self.state_size = int(units[-1])
        self._encoder = _mlp(units[:-1], activation, orthogonal, name="encoder")
        self._rnn = keras.layers.RNN(
            keras.layers.GRUCell(self.state_size), return_sequences=True, return_state=True,
            name="gru")
        self._head = _GaussianHead(action_size, init_std, init_mean_factor)

    def call(self, observ, state, reset=None):
        if reset is None:
            outputs, state = self._rnn(self._encoder(observ), initial_state=state)
        else:
            outputs, state = unroll(self._rnn.cell, self._encoder(observ), state, reset)
        return self._head(outputs), state


class CategoricalPolicy(BuiltByCall, keras.Model):
    """Feed-forward policy over `n` discrete actions: logits from a ReLU MLP.

    The logits layer is initialized small (`init_mean_factor`), so the initial policy is
    close to uniform. With `action_mask`, the logits of the actions the observation's mask
    forbids are -1e9: probability 0 (exactly, in float32) when acting, sampling and in the
    loss, while log-probabilities, entropies and KL divergences stay finite.

    Args:
      num_actions: number of discrete actions.
      units: sizes of the hidden layers.
      init_mean_factor: scale of the variance-scaling initializer of the logits layer.
      activation, orthogonal: of the hidden layers, as in `dense_layers`.
      hidden: a layer to use instead of the MLP, as in `GaussianPolicy`.
      action_mask: None, or `(offset, num_actions)`: the mask's elements in the flat
        observation (`batchrl.spaces.nested.FlatObservationSpace.action_mask`), 1 for the
        actions that may be taken.
    """

    def __init__(self, num_actions, units, init_mean_factor, activation="relu",
                 orthogonal=False, name="policy", hidden=None, action_mask=None):
        super().__init__(name=name)
        self._hidden = hidden if hidden is not None else _mlp(
            units, activation, orthogonal, name="hidden")
        self.state_size = int(getattr(self._hidden, "state_size", 0))
        self._logits = keras.layers.Dense(
            num_actions, kernel_initializer=keras.initializers.VarianceScaling(
                scale=init_mean_factor, mode="fan_avg", distribution="uniform"), name="logits")
        self._action_mask = action_mask

    def call(self, observ, state, reset=None):
        hidden, state = _run_hidden(self._hidden, observ, state, reset)
        logits = self._logits(hidden)
        if self._action_mask is not None:
            offset, size = self._action_mask
            allowed = tf.cast(observ, tf.float32)[..., offset:offset + size] > 0.5
            logits = tf.where(allowed, logits, -1e9)
        return {"logits": logits}, state


class _CategoricalHead(BuiltByCall, keras.layers.Layer):
    """Logits of `k` choices among `nvec[i]` actions each, `[batch, time, k, max(nvec)]`;
    the logits of actions a choice lacks are -1e9 (probability 0). Initialized small
    (`init_mean_factor`), so the initial policy is close to uniform."""

    def __init__(self, nvec, init_mean_factor, name="categorical"):
        super().__init__(name=name)
        nvec = np.asarray(nvec, np.int64).reshape(-1)
        self._shape = (len(nvec), int(nvec.max()))
        self._logits = keras.layers.Dense(
            int(np.prod(self._shape)), kernel_initializer=keras.initializers.VarianceScaling(
                scale=init_mean_factor, mode="fan_avg", distribution="uniform"), name="logits")
        lacking = np.arange(self._shape[1])[None, :] >= nvec[:, None]
        self._lacking = np.where(lacking, -1e9, 0.0).astype(np.float32)
        # Where each [choice, action] finds its element of a flat mask of sum(nvec)
        # elements; the actions a choice lacks point past its end (at an allowed 1).
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        self._mask_index = np.where(lacking, int(nvec.sum()),
                                    offsets[:, None] + np.arange(self._shape[1])[None, :])

    def call(self, hidden, allowed=None):
        """Logits; with `allowed` (bool `[batch, time, sum(nvec)]`, the choices' masks one
        after the other), -1e9 for the actions it forbids."""
        logits = self._logits(hidden)
        logits = tf.reshape(logits, tf.concat([tf.shape(logits)[:-1], self._shape], 0))
        logits += self._lacking
        if allowed is not None:
            padded = tf.concat([allowed, tf.ones_like(allowed[..., :1])], -1)
            logits = tf.where(tf.gather(padded, self._mask_index, axis=-1), logits, -1e9)
        return {"logits": logits}


class _BernoulliHead(BuiltByCall, keras.layers.Layer):
    """Logits of `size` independent bits, `[batch, time, size]`, initialized small."""

    def __init__(self, size, init_mean_factor, name="bernoulli"):
        super().__init__(name=name)
        self._logits = keras.layers.Dense(
            size, kernel_initializer=keras.initializers.VarianceScaling(
                scale=init_mean_factor, mode="fan_avg", distribution="uniform"), name="logits")

    def call(self, hidden):
        return {"logits": self._logits(hidden)}


class CompositePolicy(BuiltByCall, keras.Model):
    """Feed-forward policy with one head per leaf of a nested action space, on one MLP.

    A `Box` leaf gets a Gaussian head as in `GaussianPolicy` (tanh mean, learned
    observation-independent log standard deviation), a `Discrete` or `MultiDiscrete` leaf
    categorical logits per choice, a `MultiBinary` leaf Bernoulli logits per bit. The
    parameters of head `i` are returned under `leaf{i}_mean`, `leaf{i}_logstd`,
    `leaf{i}_logits`, for `batchrl.networks.distributions.Composite`.

    Args:
      heads: sequence of `(kind, argument)`: `("gaussian", size)`, `("categorical", nvec)`
        or `("bernoulli", size)`, in the order of the flat action.
      units: sizes of the hidden layers.
      init_std: initial standard deviation of the Gaussian heads (> 0).
      init_mean_factor: scale of the variance-scaling initializer of the output layers.
      activation, orthogonal: of the hidden layers, as in `dense_layers`.
      hidden: a layer to use instead of the MLP, as in `GaussianPolicy`.
      action_mask: None, or `(offset, size)` of the observation's mask as for
        `CategoricalPolicy`, for a single categorical head (a `MultiDiscrete` action):
        `size` is `sum(nvec)`, each choice's mask after the previous one's.
    """

    def __init__(self, heads, units, init_std, init_mean_factor, activation="relu",
                 orthogonal=False, name="policy", hidden=None, action_mask=None):
        super().__init__(name=name)
        self._action_mask = action_mask
        self._hidden = hidden if hidden is not None else _mlp(
            units, activation, orthogonal, name="hidden")
        layers = []
        for index, (kind, argument) in enumerate(heads):
            name = f"leaf{index}"
            if kind == "gaussian":
                layers.append(_GaussianHead(argument, init_std, init_mean_factor, name=name))
            elif kind == "categorical":
                layers.append(_CategoricalHead(argument, init_mean_factor, name=name))
            else:
                layers.append(_BernoulliHead(argument, init_mean_factor, name=name))
        self._heads = _tracked(self, "head", layers)
        self.state_size = int(getattr(self._hidden, "state_size", 0))

    def call(self, observ, state, reset=None):
        hidden, state = _run_hidden(self._hidden, observ, state, reset)
        params = {}
        for index, head in enumerate(self._heads):
            if self._action_mask is not None:  # The single categorical head.
                offset, size = self._action_mask
                allowed = tf.cast(observ, tf.float32)[..., offset:offset + size] > 0.5
                output = head(hidden, allowed)
            else:
                output = head(hidden)
            params.update({f"leaf{index}_{key}": value for key, value in output.items()})
        return params, state


class ValueNetwork(BuiltByCall, keras.Model):
    """State-value function: an MLP (`batchrl.networks.mlp.MLP`) with a linear output,
    `[batch, time]`; with `orthogonal`, the output layer is initialized orthogonally with
    gain 1. `hidden` replaces the MLP as in `GaussianPolicy`."""

    def __init__(self, units, activation="relu", orthogonal=False, name="value", hidden=None):
        super().__init__(name=name)
        self._hidden = hidden if hidden is not None else _mlp(
            units, activation, orthogonal, name="hidden")
        self._output = keras.layers.Dense(
            1, kernel_initializer=(keras.initializers.Orthogonal(gain=1.0) if orthogonal
                                   else "glorot_uniform"), name="output")

    def call(self, observ):
        return self._output(self._hidden(observ))[..., 0]

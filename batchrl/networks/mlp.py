"""The dense hidden layers of the preset networks (the policies, the value network, the
off-policy algorithms' Q networks and actors): `dense_layers` declares them, `MLP` runs
them."""

import math

import keras
import tensorflow as tf

from batchrl.networks.built_by_call import BuiltByCall
from batchrl.networks.spec import check_layers


def dense_layers(units, activation="relu", orthogonal=False):
    """The hidden layers of a preset, written as declared layers (`batchrl.networks.spec`):
    one checked `dense` layer of each size of `units`, with `activation`, and orthogonal
    kernels (gain sqrt 2, Saxe et al., arXiv:1312.6120; the gain used by most PPO
    implementations) with `orthogonal`, else Keras' Glorot-uniform default."""
    initializer = "orthogonal" if orthogonal else "glorot_uniform"
    return check_layers([
        {"type": "dense", "units": int(size), "activation": activation,
         "initializer": initializer} for size in units]) if len(units) else []


class MLP(BuiltByCall, keras.layers.Layer):
    """Dense layers on the flattened observation: `[*batch, *shape] -> float32 [*batch, n]`,
    `batch` the first `batch_dims` axes (the rest are flattened), `n` the last layer's units
    (the flattened size without layers).

    Args:
      layers: checked `dense` layers (`dense_layers`). Layers of one initializer share one
        initializer object, and with it its seed, as the presets always have.
      batch_dims: 2 for the policies and the value network (`[batch, time, ...]`), 1 for
        the off-policy algorithms' networks (`[batch, ...]`).
    """

    def __init__(self, layers, batch_dims, name=None):
        super().__init__(name=name)
        self._batch_dims = int(batch_dims)
        initializers = {}
        dense = []
        for spec in layers:
            if spec["initializer"] not in initializers:
                initializers[spec["initializer"]] = (
                    keras.initializers.Orthogonal(gain=math.sqrt(2))
                    if spec["initializer"] == "orthogonal" else spec["initializer"])
            dense.append(keras.layers.Dense(
                spec["units"], activation=spec["activation"],
                kernel_initializer=initializers[spec["initializer"]]))
        # Each layer an attribute of its own as well: the checkpoints' paths (`_dense0`, ...).
        for index, layer in enumerate(dense):
            setattr(self, f"_dense{index}", layer)
        self._dense = tuple(dense)

    def call(self, observ):
        observ = tf.cast(observ, tf.float32)
        hidden = tf.reshape(observ, tf.concat([tf.shape(observ)[:self._batch_dims], [-1]], 0))
        for layer in self._dense:
            hidden = layer(hidden)
        return hidden

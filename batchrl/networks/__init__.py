"""The networks of the algorithms (declared layers and their checks, torsos, policies, value
and Q networks, action distributions, the constructors of config key `network`), imported
lazily so that importing the package does not start TensorFlow."""

from batchrl import _lazy

_EXPORTS = {
    # The network constructors (`batchrl.networks` was this one module before).
    "NETWORKS": "batchrl.networks.constructors",
    "Networks": "batchrl.networks.constructors",
    "constructor": "batchrl.networks.constructors",
    "declared": "batchrl.networks.constructors",
    "feed_forward_categorical": "batchrl.networks.constructors",
    "feed_forward_composite": "batchrl.networks.constructors",
    "feed_forward_gaussian": "batchrl.networks.constructors",
    "is_declared": "batchrl.networks.constructors",
    "preset_layers": "batchrl.networks.constructors",
    "recurrent_gaussian": "batchrl.networks.constructors",
    "torso_factory": "batchrl.networks.constructors",
    # The models and distributions the constructors build, as that module reached them.
    "CategoricalPolicy": "batchrl.networks.policies",
    "CompositePolicy": "batchrl.networks.policies",
    "GaussianPolicy": "batchrl.networks.policies",
    "RecurrentGaussianPolicy": "batchrl.networks.policies",
    "ValueNetwork": "batchrl.networks.policies",
    "dense_layers": "batchrl.networks.mlp",
    "RecurrentTorso": "batchrl.networks.torso",
    "Torso": "batchrl.networks.torso",
    "Bernoulli": "batchrl.networks.distributions",
    "Categorical": "batchrl.networks.distributions",
    "Composite": "batchrl.networks.distributions",
    "DiagonalGaussian": "batchrl.networks.distributions",
    "MultiCategorical": "batchrl.networks.distributions",
}

__all__ = sorted(_EXPORTS)

__getattr__ = _lazy.exports(__name__, _EXPORTS)

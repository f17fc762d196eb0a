"""Policy and value networks: presets selected by name with the config key `network`
(their hidden layers written as declared layers: `preset_layers`), or networks of declared
layers (`network` a list of layers, or one list per observation leaf: `declared`).

A network constructor is called as `constructor(observation_space, action_space, config)`
and returns `Networks(policy, value, distribution)` (`critic` stays None):

- `policy`: a Keras model called as `policy(observ, state)` with observations float32
  `[batch, time, *observation_shape]` and the recurrent state at the first step, float32
  `[batch, policy.state_size]`; it returns `(params, state)`: a dict of distribution
  parameters, each `[batch, time, ...]`, and the state after the last step. Feed-forward
  policies have `state_size` 0 and pass the (empty) state through;
- `value`: a Keras model mapping the same observations to float32 `[batch, time]`;
- `distribution`: the class (or a `functools.partial` of one) that turns the policy's
  output into an action distribution (see `batchrl.networks.distributions`).

Observations of a nested space arrive flattened (`batchrl.spaces.nested`); a nested action
space needs `feed_forward_composite`.

Both models are built (their weights exist) when returned. The models themselves are in
`batchrl.networks.policies`.
"""

import collections
import functools

import gymnasium as gym
import numpy as np

from batchrl.networks.distributions import (
    Bernoulli,
    Categorical,
    Composite,
    DiagonalGaussian,
    MultiCategorical,
)
from batchrl.networks.mlp import dense_layers
from batchrl.networks.policies import (
    CategoricalPolicy,
    CompositePolicy,
    GaussianPolicy,
    RecurrentGaussianPolicy,
    ValueNetwork,
)
from batchrl.networks.spec import RECURRENT, check_layers
from batchrl.networks.torso import RecurrentTorso, Torso
from batchrl.spaces import nested

Networks = collections.namedtuple(
    "Networks", "policy, value, distribution, critic", defaults=(None, None, None))
Networks.__doc__ = """The networks of an algorithm, of both families (`algo.networks`).

Fields:
  policy: the model that acts, always present (`export` saves it): the policy of a
    network constructor, SAC's and TD3's actor, DQN's Q network.
  value: the state-value network of an on-policy algorithm; None off-policy.
  distribution: the action distribution class of an on-policy policy; None off-policy.
  critic: the twin Q functions of SAC and TD3; None otherwise.
"""


def feed_forward_gaussian(observation_space, action_space, config):
    """Separate policy and value MLPs; Gaussian actions for a `Box` action space.

    Config keys: `policy_layers`, `value_layers` (lists of ints), `init_std`,
    `init_mean_factor`, `activation`, `orthogonal_init`.

    Raises:
      ValueError: if the action space is not a one-dimensional `Box`.
    """
    _check_box(action_space, "feed_forward_gaussian")
    policy = GaussianPolicy(action_space.shape[0], config.policy_layers, config.init_std,
                            config.init_mean_factor, **_hidden(config))
    return _built(policy, _value(config), DiagonalGaussian, observation_space)


def recurrent_gaussian(observation_space, action_space, config):
    """A GRU policy (`RecurrentGaussianPolicy`, encoder `policy_layers[:-1]`, GRU of
    `policy_layers[-1]` units) and a feed-forward value MLP; Gaussian actions.

    Train it on chunks of consecutive steps (`chunk_length`, `batch_size`): the state at
    the start of each chunk is the one the policy had when it acted.

    Raises:
      ValueError: if the action space is not a one-dimensional `Box`.
    """
    _check_box(action_space, "recurrent_gaussian")
    policy = RecurrentGaussianPolicy(action_space.shape[0], config.policy_layers,
                                     config.init_std, config.init_mean_factor,
                                     **_hidden(config))
    return _built(policy, _value(config), DiagonalGaussian, observation_space)


def feed_forward_categorical(observation_space, action_space, config):
    """Separate policy and value MLPs; categorical actions for a `Discrete` action space.

    Config keys: `policy_layers`, `value_layers`, `init_mean_factor`, `activation`,
    `orthogonal_init`. Evaluation takes the most likely action.

    Raises:
      ValueError: if the action space is not `Discrete` (starting at 0).
    """
    if not isinstance(action_space, gym.spaces.Discrete) or action_space.start != 0:
        raise ValueError(
            f"network feed_forward_categorical needs a Discrete action space starting at 0, "
            f"got {action_space}")
    policy = CategoricalPolicy(int(action_space.n), config.policy_layers,
                               config.init_mean_factor, **_hidden(config),
                               action_mask=_action_mask(observation_space, action_space))
    return _built(policy, _value(config), Categorical, observation_space)


def feed_forward_composite(observation_space, action_space, config):
    """Separate policy and value MLPs; one distribution per leaf of the action space
    (`CompositePolicy`, `batchrl.networks.distributions.Composite`): Gaussian for a `Box`
    leaf, categorical for a `Discrete` leaf and for each element of a `MultiDiscrete` leaf,
    Bernoulli for each bit of a `MultiBinary` leaf. For a one-dimensional `Box`, a nested
    action space (`batchrl.spaces.nested.FlatActionSpace`: `Dict` / `Tuple` of those leaves),
    a `MultiDiscrete` or a `MultiBinary` space.

    Config keys: `policy_layers`, `value_layers`, `init_std` (of the Gaussian leaves),
    `init_mean_factor`, `activation`, `orthogonal_init`. Evaluation takes each leaf's mode.

    Raises:
      ValueError: for a `Discrete` action space (use `feed_forward_categorical`) or any
        other action space that is none of the above.
    """
    heads, distribution = _composite(action_space)
    policy = CompositePolicy(heads, config.policy_layers, config.init_std,
                             config.init_mean_factor, **_hidden(config),
                             action_mask=_action_mask(observation_space, action_space))
    return _built(policy, _value(config), distribution, observation_space)


def _composite(action_space):
    """`(heads, distribution)` of `CompositePolicy` and `Composite` for the action space
    (as `feed_forward_composite` documents)."""
    if isinstance(action_space, nested.FlatActionSpace):
        leaves = [(leaf.space, leaf.size) for leaf in action_space.leaves]
    elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        leaves = [(action_space, action_space.shape[0])]
    else:
        raise ValueError(
            f"network feed_forward_composite needs a one-dimensional Box or a nested action "
            f"space (Dict / Tuple of Box, Discrete, MultiDiscrete, MultiBinary), got "
            f"{action_space}"
            + ("; use feed_forward_categorical for a Discrete one"
               if isinstance(action_space, gym.spaces.Discrete) else ""))
    heads, components = [], []
    for index, (leaf, size) in enumerate(leaves):
        if isinstance(leaf, gym.spaces.Box):
            heads.append(("gaussian", size))
            distribution = DiagonalGaussian
        elif isinstance(leaf, gym.spaces.Discrete):
            heads.append(("categorical", [leaf.n]))
            distribution = MultiCategorical
        elif isinstance(leaf, gym.spaces.MultiDiscrete):
            heads.append(("categorical", leaf.nvec))
            distribution = MultiCategorical
        else:
            heads.append(("bernoulli", size))
            distribution = Bernoulli
        components.append((f"leaf{index}", distribution, size))
    return heads, functools.partial(Composite, components=components)


def declared(observation_space, action_space, config, layers):
    """Policy and value networks of declared layers: each has its own `batchrl.networks.torso.Torso`
    of `layers` after the config's `preprocessing` (with `share_layers`, both have the same
    one, which both networks' losses train), then the head the action space calls for:
    Gaussian (as `GaussianPolicy`) for a one-dimensional `Box`, categorical logits (as
    `CategoricalPolicy`) for a `Discrete` starting at 0, one head per leaf (as
    `CompositePolicy`) for a `MultiDiscrete`, a `MultiBinary` or a nested action space; the
    value network a linear output. A last `gru` or `lstm` layer makes the policy recurrent
    (`batchrl.networks.torso.RecurrentTorso`); the value network has a dense layer of as many units
    in its place.

    Config keys: `preprocessing`, `share_layers`, `init_std`, `init_mean_factor`, and
    `activation` and `orthogonal_init` as the layers' defaults.

    Raises:
      ValueError: a layer or a preprocessing step that does not fit the observation
        (`Torso`), an action space none of the heads takes, or `share_layers` with a
        recurrent layer.
    """
    feed_forward, recurrent = _split_recurrent(layers)

    def new_torso(listed):
        return Torso(listed, config.preprocessing, observation_space,
                     config.activation, config.orthogonal_init)

    if recurrent is not None:
        if config.share_layers:
            raise ValueError("share_layers needs feed-forward layers: the value network "
                             "has no recurrent state")
        value = ValueNetwork(None, hidden=new_torso(_with_last(
            layers, {"type": "dense", "units": recurrent["units"],
                     "activation": "config", "initializer": "config"})))

        def torso():
            return RecurrentTorso(new_torso(feed_forward), recurrent)
    else:
        shared = new_torso(layers) if config.share_layers else None

        def torso():
            return shared if shared is not None else new_torso(layers)

        value = ValueNetwork(None, hidden=torso())
    if (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
            and not isinstance(action_space, nested.FlatActionSpace)):
        policy = GaussianPolicy(action_space.shape[0], None, config.init_std,
                                config.init_mean_factor, hidden=torso())
        return _built(policy, value, DiagonalGaussian, observation_space)
    if isinstance(action_space, gym.spaces.Discrete) and action_space.start == 0:
        policy = CategoricalPolicy(int(action_space.n), None, config.init_mean_factor,
                                   hidden=torso(),
                                   action_mask=_action_mask(observation_space, action_space))
        return _built(policy, value, Categorical, observation_space)
    heads, distribution = _composite(action_space)
    policy = CompositePolicy(heads, None, config.init_std, config.init_mean_factor,
                             hidden=torso(),
                             action_mask=_action_mask(observation_space, action_space))
    return _built(policy, value, distribution, observation_space)


def _split_recurrent(layers):
    """`(layers without a last recurrent layer, that layer or None)`, for a list or a
    mapping of leaves (whose recurrent layer is the last of its `layers`)."""
    listed = layers if isinstance(layers, list) else layers["layers"]
    if not listed or listed[-1]["type"] not in RECURRENT:
        return layers, None
    return _with_last(layers, None), listed[-1]


def _with_last(layers, last):
    """`layers` (a list, or a mapping of leaves) with the last of its (shared) list replaced
    by `last`, or removed when `last` is None."""
    listed = layers if isinstance(layers, list) else layers["layers"]
    listed = listed[:-1] + ([] if last is None else [last])
    return listed if isinstance(layers, list) else dict(layers, layers=listed)


def preset_layers(name, config):
    """The hidden layers of the preset `name` for `config`, as declared layers
    (`batchrl.networks.spec`): `{"policy": [...], "value": [...]}`. Every preset puts
    `dense_layers` of `policy_layers` and `value_layers` before its heads;
    `recurrent_gaussian` ends the policy's list in a `gru` layer of `policy_layers[-1]`
    units. The preset networks are built from these lists (with one initializer object
    per list, so that they are the same networks, and train the same, as before the
    presets were written this way).

    Raises:
      KeyError: `name` is not a preset of `NETWORKS`.
    """
    if name not in NETWORKS:
        raise KeyError(f"no preset network {name!r}; presets: {', '.join(NETWORKS)}")
    hidden = _hidden(config)
    units = list(config.policy_layers)
    if name == "recurrent_gaussian":
        policy = dense_layers(units[:-1], **hidden) + check_layers(
            [{"type": "gru", "units": int(units[-1])}])
    else:
        policy = dense_layers(units, **hidden)
    return {"policy": policy, "value": dense_layers(config.value_layers, **hidden)}


def torso_factory(config):
    """For config key `network` declaring feed-forward layers: a function of an observation
    space that returns a new `batchrl.networks.torso.Torso` of them after the config's
    `preprocessing` (the hidden layers of an off-policy algorithm's networks, e.g. DQN's Q
    network and its target); None for a preset.

    Raises:
      ValueError: a recurrent last layer (off-policy algorithms learn from single steps;
        `configs.load` refuses it first, naming the algorithms that take one).
    """
    if not is_declared(config.network):
        return None
    if _split_recurrent(config.network)[1] is not None:
        raise ValueError("the off-policy algorithms take feed-forward layers (they learn "
                         "from single steps); a gru or lstm layer needs an on-policy one "
                         "(batchrl.algorithms.registry)")
    return functools.partial(Torso, config.network, config.preprocessing,
                             activation=config.activation, orthogonal=config.orthogonal_init)


def is_declared(network):
    """Whether config key `network` declares layers (a list, or a mapping of leaves) rather
    than naming a preset."""
    return isinstance(network, list | dict)


def constructor(network):
    """The network constructor of config key `network`: a preset of `NETWORKS` by name, or
    `declared` for (checked) declared layers: a list, or a mapping per observation leaf."""
    if is_declared(network):
        return functools.partial(declared, layers=network)
    return NETWORKS[network]


def _action_mask(observation_space, action_space):
    """`(offset, size)` of the observation's action mask for `CategoricalPolicy` (a
    `Discrete` action) or `CompositePolicy` (a `MultiDiscrete` one), or None.

    Raises:
      ValueError: the mask's size is not the number of actions (of all choices, for a
        `MultiDiscrete`), or the action space is neither.
    """
    mask = getattr(observation_space, "action_mask", None)
    if mask is None:
        return None
    leaves = getattr(action_space, "leaves", ())  # A `FlatActionSpace`'s.
    if isinstance(action_space, gym.spaces.Discrete):
        actions, what = int(action_space.n), "the Discrete action space"
    elif len(leaves) == 1 and isinstance(leaves[0].space, gym.spaces.MultiDiscrete):
        nvec = leaves[0].space.nvec
        actions = int(np.sum(nvec))
        what = f"the MultiDiscrete action space {nvec.tolist()} (their sum)"
    else:
        raise ValueError("the observation's action_mask needs a Discrete or MultiDiscrete "
                         "action space (categorical heads), whose logits it masks")
    if mask[1] != actions:
        raise ValueError(f"the observation's action_mask has {mask[1]} elements, "
                         f"{what} {actions} actions")
    return mask


def _hidden(config):
    """The hidden layers' keyword arguments of the config (`activation`, `orthogonal`)."""
    return {"activation": config.activation, "orthogonal": config.orthogonal_init}


def _value(config):
    return ValueNetwork(config.value_layers, **_hidden(config))


def _check_box(action_space, name):
    if isinstance(action_space, nested.FlatActionSpace):
        raise ValueError(
            f"network {name} needs a one-dimensional Box action space, got "
            f"{action_space.space}; use feed_forward_composite for it")
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(
            f"network {name} needs a one-dimensional Box action space, got {action_space}")


def _built(policy, value, distribution, observation_space):
    if (getattr(observation_space, "action_mask", None) is not None
            and getattr(policy, "_action_mask", None) is None):
        raise ValueError("the observation's action_mask needs a Discrete or MultiDiscrete "
                         "action space (categorical heads), whose logits it masks")
    dummy = np.zeros((1, 1) + observation_space.shape, np.float32)
    policy(dummy, np.zeros((1, policy.state_size), np.float32))
    value(dummy)
    return Networks(policy, value, distribution)


NETWORKS = {
    "feed_forward_gaussian": feed_forward_gaussian,
    "recurrent_gaussian": recurrent_gaussian,
    "feed_forward_categorical": feed_forward_categorical,
    "feed_forward_composite": feed_forward_composite,
}

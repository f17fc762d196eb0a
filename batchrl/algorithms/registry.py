"""The one registry of batchrl's algorithms: what each is called in configs, where its class
lives, and what it declares (its family, what its actors send, the network presets it
builds, whether it trains recurrent layers), readable without importing TensorFlow, so
that the configs, `build` and the command line ask the same table."""

import dataclasses
import importlib

# The network presets (config key `network`, `batchrl.networks.constructors.NETWORKS`).
PRESETS = ("feed_forward_gaussian", "recurrent_gaussian", "feed_forward_categorical",
           "feed_forward_composite")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One algorithm of the registry.

    Attributes:
      name: str, the config's `algorithm`.
      path: str, `module:Class` of its class.
      family: "on_policy" (learns from rollouts of every agent) or "off_policy" (from a
        replay memory).
      actors: what its Ray actors send the learner with `actors` above 0: "fragments"
        (rollouts of `rollout_length` steps, `batchrl.distributed.fragment`: every
        on-policy algorithm that reads `rollout_length`), "transitions" (Ape-X's n-step
        transitions with first priorities, `batchrl.distributed.transitions`: the
        off-policy ones), or None (it does not learn from actors); the class's own
        `actors` attribute (`batchrl.algorithms.base.Algorithm.actors`) says the same.
      presets: the presets of config key `network` it builds (tuple of str); declared
        layers it takes always.
      recurrent: bool, whether it trains a declared network whose last layer is a `gru`
        or `lstm` (off-policy algorithms learn from single steps, with feed-forward
        networks).
    """

    name: str
    path: str
    family: str
    actors: str | None
    presets: tuple
    recurrent: bool

    def load(self):
        """The algorithm's class (imports its module, and TensorFlow)."""
        module, _, attribute = self.path.partition(":")
        return getattr(importlib.import_module(module), attribute)


# The off-policy algorithms build MLPs of `policy_layers` and `value_layers` (or a torso of
# declared layers), which feed_forward_gaussian, the default, stands for, and for dqn's
# Discrete actions feed_forward_categorical too; a GRU or one head per action leaf they
# would not build.
_FEED_FORWARD = ("feed_forward_gaussian",)
_ENTRIES = (
    Entry("ppo", "batchrl.algorithms.ppo:PPO", "on_policy", "fragments", PRESETS, True),
    Entry("trpo", "batchrl.algorithms.trpo:TRPO", "on_policy", "fragments", PRESETS, True),
    Entry("a2c", "batchrl.algorithms.a2c:A2C", "on_policy", "fragments", PRESETS, True),
    Entry("impala", "batchrl.algorithms.impala:IMPALA", "on_policy", "fragments", PRESETS,
          True),
    Entry("appo", "batchrl.algorithms.appo:APPO", "on_policy", "fragments", PRESETS, True),
    Entry("pqn", "batchrl.algorithms.pqn:PQN", "on_policy", "fragments",
          ("feed_forward_categorical", "feed_forward_composite"), False),
    Entry("sac", "batchrl.algorithms.sac:SAC", "off_policy", "transitions", _FEED_FORWARD,
          False),
    Entry("td3", "batchrl.algorithms.td3:TD3", "off_policy", "transitions", _FEED_FORWARD,
          False),
    Entry("dqn", "batchrl.algorithms.dqn:DQN", "off_policy", "transitions",
          _FEED_FORWARD + ("feed_forward_categorical",), False),
)
ALGORITHMS = {entry.name: entry for entry in _ENTRIES}
NAMES = tuple(ALGORITHMS)


def entry(name):
    """The `Entry` of algorithm `name` (str), or None for a name the registry does not hold
    (e.g. a user's `module:NAME`)."""
    return ALGORITHMS.get(name)


def names(**declared):
    """The names of the algorithms whose entries have the given attribute values, in the
    registry's order: e.g. `names(recurrent=True)`, `names(actors="fragments")`."""
    return tuple(item.name for item in _ENTRIES
                 if all(getattr(item, key) == value for key, value in declared.items()))


def actors(name):
    """What the actors of algorithm `name` (a config's `algorithm`) send the learner: its
    entry's `actors`, or for a `module:NAME` class outside the registry the class's own
    `actors` attribute (this imports its module; None when it cannot be imported or
    declares none: `batchrl.build.algorithm_class` says why)."""
    item = entry(name)
    if item is not None:
        return item.actors
    module, _, attribute = name.partition(":")
    try:
        return getattr(getattr(importlib.import_module(module), attribute, None), "actors",
                       None)
    except ImportError:
        return None


def with_actors():
    """The names of the algorithms that learn from Ray actors (`actors` not None)."""
    return tuple(item.name for item in _ENTRIES if item.actors is not None)


def classes():
    """{name: class} of every algorithm of the registry (imports them, and TensorFlow)."""
    return {item.name: item.load() for item in _ENTRIES}

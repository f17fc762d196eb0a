"""Building the algorithm of a config: the in-graph environment, the algorithm (BatchPPO,
TRPO, A2C, IMPALA, APPO, PQN, SAC, TD3, DQN or one of `build_algorithm`) and its checkpoint
(shared by `train`, `visualize`, `export` and `batchrl.Agent`)."""

import collections
import functools
import importlib
import random

import tensorflow as tf

from batchrl import configs, environments
from batchrl.algorithms.base import Algorithm
from batchrl.algorithms.builder import FunctionalAlgorithm
from batchrl.algorithms.off_policy import OffPolicyAlgorithm
from batchrl.algorithms.registry import classes as registered_classes
from batchrl.environments.frame_stack import FrameStack
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.networks import spec as network_spec
from batchrl.networks.constructors import NETWORKS, constructor, is_declared, torso_factory

Built = collections.namedtuple(
    "Built", "batch_env, algo, step, is_training, should_log, checkpoint")
# {name: class} of the algorithms of the registry (`batchrl.algorithms.registry`): the values
# of config key `algorithm`, besides `module:NAME`.
ALGORITHMS = registered_classes()
# What `simulate` calls: a class that is not an `Algorithm` but has these is accepted.
_METHODS = ("begin_episodes", "perform", "experience", "end_episodes")


def algorithm_class(config):
    """The algorithm class that config key `algorithm` names, checked against the config.

    Each algorithm declares the config keys it reads (`config_keys`, see
    `batchrl.algorithms.OnPolicyAlgorithm`). A key that another algorithm (of
    `ALGORITHMS`) reads and this one does not must keep its default value (`default.yaml`),
    as a key that no algorithm reads would be unknown: e.g. `update_epochs` or
    `kl_reference` for trpo, `optimizer` for ppo. A class without `config_keys` is not
    checked.

    A `module:NAME` algorithm is a subclass of `batchrl.algorithms.base.Algorithm`, or,
    for algorithms written before that class, any class with the methods
    `begin_episodes`, `perform`, `experience` and `end_episodes` (duck typing: still
    accepted).

    Raises:
      ConfigError: a `module:NAME` that cannot be imported or is not an algorithm class; a
        key set to other than its default for an algorithm that does not read it; a
        keyword of an algorithm's functions that is not a config key.
    """
    name = config.algorithm
    if name in ALGORITHMS:
        algorithm = ALGORITHMS[name]
    else:
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise configs.ConfigError(f"config key 'algorithm': cannot import module "
                                      f"{module_name!r} ({error})") from None
        algorithm = getattr(module, attribute, None)
        if not isinstance(algorithm, type) or not (issubclass(algorithm, Algorithm) or all(
                hasattr(algorithm, method) for method in _METHODS)):
            raise configs.ConfigError(
                f"config key 'algorithm': {name} is not an algorithm class (one with "
                f"{', '.join(_METHODS)}, e.g. made by build_algorithm)")
    functional = issubclass(algorithm, FunctionalAlgorithm)
    for role, key in sorted(algorithm.required_config_keys() if functional else ()):
        if key not in config:
            raise configs.ConfigError(
                f"config key 'algorithm': {role} of {name!r} takes the keyword {key!r}, "
                f"which is not a config key")
    read = getattr(algorithm, "config_keys", None)
    if read is not None:
        others = set(read).union(*(other.config_keys for other in ALGORITHMS.values()))
        defaults = _defaults()
        unread = [key for key, default in defaults.items()
                  if key in others - set(read) and config.get(key, default) != default]
        if unread:
            values = ", ".join(configs.dump({key: defaults[key]}).strip() for key in unread)
            keys = ", ".join(repr(key) for key in unread)
            raise configs.ConfigError(
                f"config key {keys} is not read by algorithm {name!r}; remove it or set it "
                f"to its default ({values})" if len(unread) == 1 else
                f"config keys {keys} are not read by algorithm {name!r}; remove them or set "
                f"them to their defaults ({values})")
    return algorithm


@functools.cache
def _defaults():
    """default.yaml's config, read once per process (`algorithm_class` only reads it)."""
    return configs.load("default")


def check(config):
    """Checks what the config names against the registries.

    Raises:
      ConfigError: unknown environment id, network or algorithm (`algorithm_class`), no
        episode length limit, `jit_step` with an environment stepped outside TensorFlow,
        `preprocessing` or `share_layers` with a preset network, a `normalize` step with
        `normalize_observ`, what the algorithm's own `check_config` refuses (impala's
        and appo's `c_bar` above `rho_bar`), or appo's `batch_size` above the rows of its
        batches.
    """
    environments.check_env_id(config.env)
    if config.jit_step and environments.native_class(config.env) is None:
        raise configs.ConfigError(
            f"config key 'jit_step' needs an in-graph environment of batchrl.native_tasks (e.g. "
            f"batchrl.native_tasks:Pendulum); env {config.env!r} is stepped outside TensorFlow, "
            f"which XLA cannot compile")
    declared = is_declared(config.network)
    if not declared and config.network not in NETWORKS:
        raise configs.ConfigError(
            f"unknown network {config.network!r} (config key 'network'); "
            f"choices: {', '.join(sorted(NETWORKS))}, or declared layers")
    for key in ("preprocessing", "share_layers"):
        if config[key] and not declared:
            raise configs.ConfigError(
                f"config key {key!r} needs a network of declared layers (network: a list "
                f"of layers), not the preset {config.network!r}")
    if config.normalize_observ and network_spec.plan(config.preprocessing).normalized:
        raise configs.ConfigError(
            "config key 'preprocessing' has a normalize step and 'normalize_observ' is "
            "true: choose one (normalize_observ: false to normalize only where the steps "
            "say)")
    environments.episode_limit(config)
    check_config = getattr(algorithm_class(config), "check_config", None)
    if check_config is not None:  # An algorithm's own checks, e.g. impala's c_bar.
        check_config(config)
    if config.algorithm == "appo" and config.batch_size:
        rows, key = ((config.envs_per_actor, "envs_per_actor") if config.actors
                     else (config.num_agents, "num_agents"))
        if config.batch_size > rows:
            raise configs.ConfigError(
                f"config key 'batch_size' ({config.batch_size}): appo's minibatches are "
                f"rows of a batch, and a batch has {key} = {rows} rows")


def in_graph_env(config, batch_env):
    """`batch_env` as the algorithm sees it: wrapped in an `InGraphBatchEnv` (unless it is
    an in-graph environment of `batchrl.native_tasks`), and that in a `FrameStack` for a
    `frame_stack` preprocessing step of `config`."""
    in_graph = batch_env if getattr(batch_env, "in_graph", False) is True else (
        InGraphBatchEnv(batch_env))
    frames = network_spec.plan(config.preprocessing).frames
    return FrameStack(in_graph, frames) if frames else in_graph


def algorithm_config(config):
    """The config an algorithm (or its acting half) is built with: a copy of `config` whose
    `network` is the constructor it names, whose `max_length` is the episode limit, and
    whose `normalize` preprocessing steps turn on the observation filter
    (`normalize_observ`, `normalize_keys`)."""
    algo_config = configs.Config(config)
    algo_config["network"] = constructor(config.network)
    normalized = network_spec.plan(config.preprocessing).normalized
    if normalized is not None:  # `normalize` steps: the algorithm's observation filter.
        algo_config["normalize_observ"] = True
        algo_config["normalize_keys"] = None if normalized is True else normalized
    algo_config["max_length"] = environments.episode_limit(config)
    return algo_config


def acting_half(config, batch_env):
    """The acting half alone of the config's algorithm (its `actor_class`) for `batch_env`
    (an in-graph batch environment: `in_graph_env`), keeping acting state for each of its
    agents; for an off-policy algorithm, with its critic (`OffPolicyActor`'s `critic`), so
    that it gives its transitions first priorities. What an actor process builds: no
    optimizer, no memory; its weights come from the learner's acting half
    (`get_weights` / `set_weights`).

    Raises:
      ConfigError: as `algorithm_class`.
    """
    algorithm = algorithm_class(config)
    algo_config = algorithm_config(config)
    options = {}
    if issubclass(algorithm, OffPolicyAlgorithm):
        algo_config["torso"] = torso_factory(config)
        options = {"action_shape": tuple(batch_env.action.shape[1:]), "critic": True}
    return algorithm.actor_class(
        batch_env.observation_space, batch_env.action_space, algo_config,
        observ_shape=tuple(batch_env.observ.shape[1:]), observ_dtype=batch_env.observ.dtype,
        num_agents=len(batch_env), **options)


def build(config, batch_env, process_eager=True):
    """The agent of `config` acting in `batch_env`.

    Wraps `batch_env` in an `InGraphBatchEnv` (unless it is an in-graph environment of
    `batchrl.native_tasks`), and that in a `FrameStack` for a `frame_stack` preprocessing step, and
    builds the config's algorithm with a global step (int64, training environment steps)
    and the `is_training` / `should_log` variables. `normalize` preprocessing steps turn on
    the algorithm's observation normalizer for the observation or the entries that list
    them; an off-policy algorithm gets a `torso` factory for declared layers
    (`batchrl.networks.torso_factory`).

    The networks' initial weights are a function of `config.seed` alone, and the process's
    random generators are left as they were: Keras draws the seeds of the networks'
    unseeded initializers from Python's global `random` generator
    (`keras.random.make_default_seed`), so it is seeded with `config.seed` while the
    algorithm is built and then given back its previous state (the same weights as
    `keras.utils.set_random_seed(config.seed)` before the build). NumPy's and TensorFlow's
    global generators are not touched; the algorithm samples with its own
    `tf.random.Generator` seeded with `config.seed`. (Not thread-safe: another thread
    drawing from `random` during the build would draw from the seeded state.)

    Args:
      config: a validated `Config`.
      batch_env: a `BatchEnv` of the config's environment, or an in-graph environment
        (`environments.create_batch` returns either).
      process_eager: bool; True (the commands, which own their process): every
        `tf.function` of the process runs eagerly from now on when `config.eager` (traced
        otherwise). False (`batchrl.Agent`, inside an application): the process's eager
        mode is left alone, and the caller runs its functions under `config.eager`.

    Returns:
      `Built`; its `checkpoint` (`tf.train.Checkpoint`) holds the step and everything that
      defines training (`algo.checkpoint_state`).

    Raises:
      ConfigError: the config's network does not fit the spaces of `batch_env`, or its
        algorithm is unknown or does not fit the config (`algorithm_class`).
    """
    algorithm = algorithm_class(config)
    if process_eager:
        tf.config.run_functions_eagerly(bool(config.eager))
    in_graph = in_graph_env(config, batch_env)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    is_training = tf.Variable(True, trainable=False, name="is_training")
    should_log = tf.Variable(True, trainable=False, name="should_log")
    algo_config = algorithm_config(config)
    python_random = random.getstate()
    random.seed(config.seed)
    try:
        if issubclass(algorithm, OffPolicyAlgorithm):
            algo_config["torso"] = torso_factory(config)
        algo = algorithm(in_graph, step, is_training, should_log, algo_config)
    except ValueError as error:  # The networks check the spaces they are built for.
        if issubclass(algorithm, OffPolicyAlgorithm):  # Its messages name the key.
            raise configs.ConfigError(f"algorithm {config.algorithm!r}: {error}") from None
        if is_declared(config.network):
            raise configs.ConfigError(f"config key 'network': {error}") from None
        raise configs.ConfigError(
            f"config key 'network' is {config.network!r}: {error}") from None
    finally:
        random.setstate(python_random)
    checkpoint = tf.train.Checkpoint(step=step, **algo.checkpoint_state)
    return Built(in_graph, algo, step, is_training, should_log, checkpoint)

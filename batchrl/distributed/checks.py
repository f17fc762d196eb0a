"""The checks of a config's actor-learner keys (`actors`, `learners`, `max_policy_lag`, ...),
without TensorFlow: `batchrl-train` runs them before it starts the actors, which it does before
it imports TensorFlow itself."""

from batchrl import configs
from batchrl.algorithms import registry


def check(config):
    """Checks the actor-learner keys of `config`.

    Raises:
      ConfigError: `learners` above 1 without actors; with `actors` above 0: an
        algorithm that cannot learn from actors, no `rollout_length` (the steps per agent
        of an actor's call), a `max_policy_lag` below `broadcast_every - 1` (the fragments
        acted with the newest weights would grow too old before the next publication), or
        `learners` above 1 that cannot share the update (`_check_learners`).

    TensorFlow is not imported, but for `learners` above 1 and for an algorithm
    `module:NAME` whose module imports it.
    """
    if not config.actors:
        if config.learners > 1:
            raise configs.ConfigError(
                f"config key 'learners' ({config.learners}) needs actors: the learners share "
                f"the update of the actors' fragments (set actors, e.g. {config.learners})")
        return
    if (config.max_policy_lag is not None
            and config.max_policy_lag < config.broadcast_every - 1):
        raise configs.ConfigError(
            f"config keys 'max_policy_lag' ({config.max_policy_lag}) and 'broadcast_every' "
            f"({config.broadcast_every}): max_policy_lag must be at least broadcast_every - 1, "
            f"or fragments acted with the newest weights are dropped before the next "
            f"publication")
    if registry.actors(config.algorithm) is None:
        raise configs.ConfigError(
            f"config key 'actors': algorithm {config.algorithm!r} does not learn from actors; "
            f"choices: {', '.join(registry.with_actors())}, an algorithm of build_algorithm, "
            f"or actors: 0")
    if not config.rollout_length:
        raise configs.ConfigError("config key 'actors' needs rollout_length (the steps per "
                                  "agent of an actor's fragment, e.g. 20)")
    if config.learners > 1:
        _check_learners(config)


def _check_learners(config):
    """Checks `learners` above 1: an algorithm that shares its update (IMPALA, APPO), as
    many actors for each learner, and no lag bound (the learners learn in lock-step: none
    may drop a fragment). Imports TensorFlow, last."""
    if config.actors % config.learners:
        raise configs.ConfigError(
            f"config keys 'actors' ({config.actors}) and 'learners' ({config.learners}): "
            f"each learner takes as many actors, so actors must be a multiple of learners")
    if config.max_policy_lag is not None:
        raise configs.ConfigError(
            f"config key 'max_policy_lag' ({config.max_policy_lag}) with learners "
            f"({config.learners}): the learners learn in lock-step and none may drop a "
            f"fragment; set max_policy_lag: null")
    from batchrl import build  # TensorFlow: the algorithm's class says whether it shares.

    if not hasattr(build.algorithm_class(config), "share_update"):
        raise configs.ConfigError(
            f"config key 'learners' ({config.learners}): algorithm {config.algorithm!r} does "
            f"not share its update; impala and appo do (or learners: 1)")

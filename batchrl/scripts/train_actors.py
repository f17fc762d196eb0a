"""The other processes of a training run with actors (`batchrl-train`): the Ray actors
(`batchrl.distributed.pool`) and, with `learners` above 1, the learners that share the
update (`batchrl.distributed.learners`): started, reported and closed."""

import os

from batchrl import configs


def start_learners(config, logdir, setup):
    """With `learners` above 1: starts learners 1 to M - 1 (`batchrl.distributed.learners`,
    each with its share of the actors, from the run's latest checkpoint in `logdir` if
    any) and makes this process learner 0 of their collective cluster; call it before
    TensorFlow runs anything. `setup` is what each learner process, and each actor of
    theirs, calls first (picklable, e.g. `train.start_actor_process`). Returns
    `(learners, all_reduce)`: the Ray actors (their `join` done) and this process's
    `collective.AllReduce` (`IMPALA.share_update`).

    Raises:
      ConfigError: Ray cannot be started or reached.
    """
    import tensorflow as tf

    from batchrl.distributed import collective
    from batchrl.distributed import learners as learners_lib
    from batchrl.environments.ray import connection

    try:
        ray = connection.connect(config.ray_address)
    except connection.RayUnavailable as error:
        raise configs.ConfigError(str(error)) from None
    others, addresses = learners_lib.start(config, setup)
    addresses = [learners_lib.free_address()] + addresses
    checkpoint = tf.train.latest_checkpoint(logdir)
    joins = [learner.join.remote(addresses, checkpoint) for learner in others]
    all_reduce = collective.connect(addresses, 0, timeout=config.worker_timeout)
    ray.get(joins)
    return others, all_reduce


def start_actors(config, setup):
    """The Ray actors of a config with `actors` above 0 (`batchrl.distributed.pool`), on a
    local Ray or the cluster at `ray_address`, with this process's TensorFlow log level
    and Grappler setting; each calls `setup` first (picklable, e.g.
    `train.start_actor_process`). They build their environments and policies meanwhile
    (`report_actors` waits for them).

    Raises:
      ConfigError: Ray cannot be started or reached, or has too few CPUs.
    """
    from batchrl.distributed.actor import actor_class
    from batchrl.distributed.pool import ActorPool
    from batchrl.environments.ray.connection import RayUnavailable
    from batchrl.environments.ray.driver import NotEnoughCPUs

    env_vars = {key: os.environ[key] for key in ("TF_CPP_MIN_LOG_LEVEL", "BATCHRL_GRAPPLER")
                if key in os.environ}
    try:  # With learners sharing the update, this one's share of the actors.
        pool = ActorPool(config, config.actors // config.learners, config.actor_cpus,
                         config.fragments_in_flight,
                         config.worker_timeout, config.worker_restarts, config.ray_address,
                         {"env_vars": env_vars}, setup,
                         actor_class(config.algorithm))
    except (RayUnavailable, NotEnoughCPUs) as error:
        raise configs.ConfigError(str(error)) from None
    return pool


def report_actors(config, pool):
    """Waits until the actors of `pool` are built and says where they run.

    Raises:
      batchrl.drivers.loop.EnvironmentFailed: an actor failed to build.
    """
    from batchrl.drivers.loop import EnvironmentFailed
    from batchrl.environments.wrappers import WorkerError

    try:
        pool.wait_built()
    except WorkerError as error:
        raise EnvironmentFailed(f"before the first step: {error}") from error
    nodes = count(len(set(pool.nodes)), 'node')
    where = (f"; {count(config.learners, 'learner')} sharing the update, this one with "
             f"{count(config.actors // config.learners, 'actor')} on {nodes}"
             if config.learners > 1 else f" on {nodes}")
    print(f"Actors: {count(config.actors, 'Ray actor')} of {config.envs_per_actor} "
          f"environments each ({config.actors * config.envs_per_actor} in all){where}.",
          flush=True)


def count(number, noun):
    """`number` and `noun`, plural unless it is one: "1 actor", "2 actors"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def close_learners(shared):
    """Closes the other learners' pools and ends their processes."""
    if shared is None:
        return
    import ray

    for learner in shared[0]:
        try:
            ray.get(learner.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a learner that died or hangs: killed below.
            pass
        ray.kill(learner)

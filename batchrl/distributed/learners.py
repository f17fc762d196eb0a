"""M learners that share the update (`learners: M`, issue 61): the train process is learner
0; learners 1 to M - 1 are Ray actors (`RemoteLearner`), each with its share of the actors
(a pool of its own). Every update, each learner learns from one fragment of its own actors
and the learners average their gradients and add their fragments' statistics on
TensorFlow's collective all-reduce (`collective`), so that they stay equal, as one learner
on the union of their fragments. Learner 0 evaluates, writes the checkpoints and the
summaries, and tells the others how many updates each train phase makes (they learn in
lock-step); a learner that dies makes the others' next all-reduce fail after
`worker_timeout` seconds, and the run ends with its last checkpoint, from which the same
command resumes."""

import os
import socket

import numpy as np

# TensorFlow is imported in `RemoteLearner.join`, after `collective.connect` sets
# `TF_CONFIG`: the module itself is imported wherever Ray unpickles the class.


def free_ports(count):
    """`count` TCP ports of this machine that are free now, all different (bound together
    while they are chosen): list of int."""
    sockets = [socket.socket() for _ in range(int(count))]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_address():
    """"host:port" of a free TCP port of this machine, for a learner's collective server:
    the host as Ray's nodes reach it (`ray.util.get_node_ip_address`; Ray is connected)."""
    import ray

    return f"{ray.util.get_node_ip_address()}:{free_ports(1)[0]}"


def actor_indices(config, learner):
    """The indices (range) of the actors of learner `learner` of `config`: `actors /
    learners` consecutive ones each."""
    share = config.actors // config.learners
    return range(learner * share, (learner + 1) * share)


class RemoteLearner:
    """Learner `index` >= 1 of a run of `config` (a Ray actor, `start`).

    `address()` picks its collective server's address; `join(addresses, checkpoint)` joins
    the learners' cluster, builds the algorithm as learner 0 does (the same seed: the same
    initial weights; or the state of `checkpoint`, learner 0's latest, on a resumed run),
    and starts its actors; `train(updates)` makes that many updates, each on one fragment
    of its actors, in lock-step with the others. Returns of `train`: the environment steps
    learned from.
    """

    def __init__(self, config, index, setup=None):
        self._config = config
        self._index = int(index)
        self._setup = setup
        self._pool = self._algo = None
        self._version = 0

    def address(self):
        """An address ("host:port") for this learner's collective server."""
        return free_address()

    def join(self, addresses, checkpoint=None):
        """Joins the cluster of `addresses` (every learner's, in order), builds the
        algorithm (restored from `checkpoint`, a checkpoint path, if given) and its pool of
        actors; returns the pid."""
        if self._setup is not None:
            self._setup()
        from batchrl.distributed import collective

        all_reduce = collective.connect(addresses, self._index,
                                        timeout=self._config.worker_timeout)
        import tensorflow as tf

        from batchrl import build, configs, environments
        from batchrl.distributed.actor import actor_class
        from batchrl.distributed.pool import ActorPool

        config = self._config
        evaluation = configs.Config(config, num_agents=1, env_backend="local")
        built = build.build(evaluation, environments.create_batch(evaluation),
                            process_eager=False)
        if checkpoint is not None:
            tf.train.Checkpoint(step=built.step, **built.algo.checkpoint_state).read(
                checkpoint).assert_existing_objects_matched()
        built.algo.share_update(all_reduce)
        self._algo = built.algo
        indices = actor_indices(config, self._index)
        self._pool = ActorPool(config, len(indices), config.actor_cpus,
                               config.fragments_in_flight, config.worker_timeout,
                               config.worker_restarts, config.ray_address, None, self._setup,
                               actor_class(config.algorithm), first_index=indices.start)
        self._pool.wait_built()
        return os.getpid()

    def train(self, updates, broadcast_every):
        """Makes `updates` updates (int), each on the next fragment of this learner's actors,
        publishing the weights to them first and then every `broadcast_every` updates;
        returns the environment steps learned from (int)."""
        from batchrl.distributed.fragment import expand

        steps = 0
        self._pool.publish(self._version, self._algo.actor.get_weights())
        for update in range(int(updates)):
            taken = self._pool.next()
            self._algo.learn(expand(taken.fragment))
            steps += int(np.sum(taken.fragment["length"]))
            self._version += 1
            if (update + 1) % int(broadcast_every) == 0:
                self._pool.publish(self._version, self._algo.actor.get_weights())
        return steps

    def close(self):
        if self._pool is not None:
            self._pool.close()


def start(config, setup=None):
    """Starts learners 1 to `config.learners - 1` as Ray actors (`actor_cpus` CPUs each);
    returns them (list of Ray actor handles) and their addresses."""
    import ray

    remote = ray.remote(RemoteLearner)
    learners = [remote.options(num_cpus=config.actor_cpus).remote(config, index, setup)
                for index in range(1, config.learners)]
    return learners, ray.get([learner.address.remote() for learner in learners])

"""An actor of the actor-learner mode: in its own process, its own batch of environments
and a copy of the learner's policy (the acting half), recording fragments
(`fragment.FragmentRecorder`) with the newest weights the learner gave it; or, in Ape-X
mode, a copy of an off-policy algorithm recording n-step transitions with their first
priorities (`transitions.TransitionRecorder`)."""

import os
import socket
import threading
import time

import numpy as np

from batchrl import configs
from batchrl.algorithms import registry

# TensorFlow (with `batchrl.build`) is imported in `FragmentActor.build`, after `setup`: the
# module itself is imported wherever Ray unpickles the class.


def sends(algorithm):
    """What the actors of `algorithm` (a config's `algorithm`) send the learner, as it
    declares (`batchrl.algorithms.registry.actors`): "fragments", "transitions" (Ape-X),
    or None (it does not learn from actors)."""
    return registry.actors(algorithm)


def actor_class(algorithm):
    """The actor class of `algorithm` (a config's `algorithm` that learns from actors):
    `FragmentActor`, or `TransitionActor` for an Ape-X one."""
    return TransitionActor if sends(algorithm) == "transitions" else FragmentActor


def environment_seed(config, index, incarnation=0):
    """The seed of the first environment of actor `index`'s `incarnation` (int >= 0: the
    restarts before it) in a run of `config`; its environment j gets this seed plus j.

    The learner's own environments (its evaluation batch) take `seed + j` for j below
    `num_agents`, as every run's do; the actors' blocks of `envs_per_actor` seeds follow,
    one block per actor and incarnation, numbered `incarnation * actors + index`. So no
    two environments of a run, across actors, their restarts and evaluation, start from
    the same seed, and two runs with the same `seed` start from the same ones
    (docs/distributed.md, "Reproducibility").
    """
    block = incarnation * config.actors + index
    return config.seed + config.num_agents + block * config.envs_per_actor


def actor_config(config, index, incarnation=0):
    """The config of actor `index` (int >= 0) of a run of `config`, in its `incarnation`
    (int >= 0, the restarts before it): `envs_per_actor` environments stepped in the
    actor's process (`env_backend: local`, or the in-graph or EnvPool batch the env id
    names), and `seed` the seed of its first environment (`environment_seed`), which also
    seeds its sampling, so that no two actors, nor their restarts, nor the learner's
    evaluation draw the same episodes. An Ape-X actor's `apex_epsilon` exploration gets
    the actor's place among all actors' agents (`first`, `explorers`), so that each agent
    explores with an epsilon of its own."""
    changes = dict(num_agents=config.envs_per_actor, env_backend="local",
                   seed=environment_seed(config, index, incarnation))
    if sends(config.algorithm) == "transitions":
        exploration = config.get("exploration")
        if exploration and exploration.get("type") == "apex_epsilon":
            changes["exploration"] = dict(
                exploration, first=index * config.envs_per_actor,
                explorers=config.actors * config.envs_per_actor)
    return configs.Config(config, **changes)


def episodes(fragment, running):
    """The episodes that ended in `fragment` (`FragmentRecorder.collect`), given `running`:
    a dict of `score` float64 `[B]` and `length` int64 `[B]`, each agent's episode so far,
    which it updates. Returns `(scores, lengths)`, lists in the order the episodes ended
    (by step, then agent); an episode counts the steps and rewards of every fragment it
    spans."""
    scores, lengths = [], []
    reward, done, valid = fragment["reward"], fragment["done"], fragment["length"]
    for t in range(reward.shape[1]):
        stepped = t < valid
        running["score"][stepped] += reward[stepped, t]
        running["length"][stepped] += 1
        ended = stepped & done[:, t]
        scores.extend(running["score"][ended].tolist())
        lengths.extend(running["length"][ended].tolist())
        running["score"][ended] = 0.0
        running["length"][ended] = 0
    return scores, lengths


def _ray_node():
    """The id of the Ray node this process runs on (str), or None outside a Ray worker."""
    import sys

    ray = sys.modules.get("ray")  # Imported in every Ray worker; not imported here.
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


class FragmentActor:
    """One actor (run as a Ray actor by `pool.ActorPool`, or in-process by tests) of an
    on-policy algorithm: it records fragments (`FragmentRecorder`) with a copy of the
    learner's acting half (`Actor.get_weights`).

    Args:
      config: the run's `Config` as loaded (plain values; `network` a name or layers),
        with `rollout_length`, `envs_per_actor` and the acting keys.
      index: int >= 0, this actor's index (`actor_config`).
      setup: optional callable without arguments that `build` calls first, before
        TensorFlow is imported (e.g. to import it quietly).
      incarnation: int >= 0, the restarts of this actor before this one (`actor_config`).

    Weights reach it as publications (`take_weights`), which the pool sends as soon as the
    learner publishes, on a thread of their own while a recording runs; each `collect`
    acts with the newest publication it holds when it starts.
    """

    def __init__(self, config, index, setup=None, incarnation=0):
        self._config = actor_config(config, index, incarnation)
        self._setup = setup
        self._recorder = None
        self._batch_env = None
        self._actor = None  # The acting half (`build`).
        self._running = None
        self._version = None  # The version acting.
        self._applied = None  # The publication acting.
        self._newest = None  # (publication, version, weights), the newest taken.
        self._held = threading.Condition()

    def build(self):
        """Creates the environments and the acting half; returns a dict describing the
        actor: `pid`, `where` (host and pid, for messages), `node` (the Ray node's id, or
        None outside Ray), `agents` (int), `observ_shape` and `action_shape` (tuples) and
        `observ_dtype` (str).

        Raises:
          whatever the environments' constructors raise.
        """
        if self._setup is not None:
            self._setup()
        import tensorflow as tf

        from batchrl import build, environments

        try:  # One thread: the environments step in this process, as `local` runs do.
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TensorFlow runs already (an actor built in a test).
            pass
        batch_env = build.in_graph_env(self._config, environments.create_batch(self._config))
        self._actor = build.acting_half(self._config, batch_env)
        self._recorder = self._make_recorder(batch_env)
        self._batch_env = batch_env
        agents = len(batch_env)
        self._running = {"score": np.zeros(agents), "length": np.zeros(agents, np.int64)}
        return {"pid": os.getpid(), "where": f"{socket.gethostname()}, pid {os.getpid()}",
                "node": _ray_node(),
                "agents": agents, "observ_shape": tuple(batch_env.observ.shape[1:]),
                "observ_dtype": batch_env.observ.dtype.name,
                "action_shape": tuple(batch_env.action.shape[1:])}

    def _make_recorder(self, batch_env):
        """The recorder of the in-graph `batch_env` with the acting half (`_actor`,
        `batchrl.build.acting_half`): a `FragmentRecorder`, recording each agent's
        discounted return for `reward_normalizer: return`."""
        from batchrl.algorithms.fragment_learning import by_return
        from batchrl.distributed.fragment import FragmentRecorder

        config = self._config
        return FragmentRecorder(batch_env, self._actor, config.rollout_length,
                                config.discount if by_return(config) else None)

    def take_weights(self, publication, version, weights):
        """Keeps `weights` (the learner's `Actor.get_weights`: the policy's and the
        observation filter's arrays, and for Ape-X the critic's and the step) of policy
        `version` (int) as publication `publication` (int, rising with each of the
        learner's publications) for the next `collect` to act with; a publication older
        than one held is ignored. Safe to call from another thread while `collect` runs
        (the pool's "weights" concurrency group)."""
        with self._held:
            if self._newest is None or publication > self._newest[0]:
                self._newest = (int(publication), int(version), weights)
            self._held.notify_all()

    def collect(self, version=None, weights=None, publication=None):
        """Records one fragment with the newest weights this actor holds when it starts:
        `weights` (`take_weights`' arrays) of policy `version` (int) when given, taken
        at once (in-process callers); else, with `publication` (int), the newest
        publication taken (`take_weights`), waiting for one at least that new (the pool
        sends it before the call, on another thread); with neither, the weights it acts
        with already (the initial ones, version None, before any).

        Returns:
          dict: `fragment` (the recorder's `collect`: a `FragmentRecorder` fragment, or a
          `TransitionRecorder` recording, both NumPy arrays), `version` (int, the
          version that acted), `scores` and `lengths` (lists, the episodes that ended in
          it), `seconds` (float, wall-clock time of the recording).

        Raises:
          TimeoutError: publication `publication` did not arrive within `worker_timeout`
            seconds.
          the exception an environment raised (its batch's `error`), or TensorFlow's error
          of the recording.
        """
        if weights is not None:
            self._actor.set_weights(weights)
            self._version, self._applied = int(version), None
        elif publication is not None:
            with self._held:
                if not self._held.wait_for(
                        lambda: self._newest is not None and self._newest[0] >= publication,
                        timeout=self._config.worker_timeout):
                    raise TimeoutError(f"the learner's weights (publication {publication}) "
                                       f"did not arrive within "
                                       f"{self._config.worker_timeout:g} s")
                number, newest_version, newest = self._newest
            if number != self._applied:
                self._actor.set_weights(newest)
                self._version, self._applied = newest_version, number
        start = time.perf_counter()
        try:
            fragment = self._recorder.collect()
        except Exception as error:  # tf.errors.OpError, from an environment's exception.
            cause = getattr(self._batch_env, "error", None)
            if cause is None:
                raise
            raise cause from error
        seconds = time.perf_counter() - start
        scores, lengths = episodes(fragment, self._running)
        return {"fragment": fragment, "version": self._version, "scores": scores,
                "lengths": lengths, "seconds": seconds}

    def close(self):
        """Closes the environments (their worker threads or processes stop)."""
        if self._batch_env is not None:
            self._batch_env.close()


class TransitionActor(FragmentActor):
    """An Ape-X actor (Horgan et al. 2018, arXiv:1803.00933) of an off-policy algorithm
    (`dqn`, `sac`, `td3`): its acting half alone, with the critic of the TD error
    (`batchrl.build.acting_half`: no optimizer, no replay memory), acting with its
    exploration; its `collect` returns the n-step transitions its steps completed with
    their TD errors (`transitions.TransitionRecorder`) instead of a fragment. The weights
    it takes are the learner's acting half's (`OffPolicyActor.get_weights`: the policy,
    the observation filter, the critic and the global step). Arguments as
    `FragmentActor`'s.
    """

    def _make_recorder(self, batch_env):
        from batchrl.distributed.transitions import TransitionRecorder

        config = self._config
        return TransitionRecorder(batch_env, self._actor, config.rollout_length,
                                  config.n_step, config.discount)

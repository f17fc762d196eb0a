"""What off-policy algorithms share: acting with exploration, a replay memory filled from
every batch step, and gradient updates on sampled batches inside the same graph call.

Mnih et al. 2015 (experience replay, target networks); Schaul et al. 2016,
arXiv:1511.05952 (prioritized replay); Sutton & Barto 2018, section 7.1 (n-step returns).
"""

import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl import optimizers
from batchrl.algorithms.base import Algorithm, checked
from batchrl.memories.replay import ReplayMemory
from batchrl.memories.samplers import annealed_beta
from batchrl.spaces import nested
from batchrl.tools.graph import after

TD_ERROR = "td_error"  # The entry of `update`'s result that sets priorities.


def polyak(target, online, rate):
    """Moves the `target` variables towards the `online` ones: t <- rate * o + (1 - rate)
    * t (Lillicrap et al. 2016, arXiv:1509.02971, algorithm 1; rate 1 copies). Returns
    the assignments."""
    return [t.assign(rate * o + (1.0 - rate) * t)
            for t, o in zip(target, online, strict=True)]


def adam(learning_rate, variables, max_gradient_norm=None):
    """Adam at `learning_rate` (float), its gradients clipped to the global norm
    `max_gradient_norm` (None: not clipped), as a `batchrl.optimizers` module built for
    `variables` (list of `tf.Variable`s). Its Keras optimizer (`.optimizer`) is what
    `checkpoint_state` holds, at the paths of checkpoints written before the module."""
    optimizer = optimizers.create({"type": "adam"}, learning_rate, max_gradient_norm)
    optimizer.build(variables)
    return optimizer


def flat_action(action):
    """Box actions `[n, *action_shape]` as the critics of SAC and TD3 take them: float32
    `[n, size]`."""
    action = tf.cast(action, tf.float32)
    return tf.reshape(action, [tf.shape(action)[0], math.prod(action.shape[1:])])


def target_of(model, build, *inputs):
    """A target network of `model`: `build()` makes a model of the same architecture,
    which is built by calling both on the example `inputs` and given `model`'s weights."""
    target = build()
    model(*inputs)
    target(*inputs)
    for t, o in zip(target.variables, model.variables, strict=True):
        t.assign(o)
    return target


def check_box_actions(name, space):
    """Checks that the algorithm `name` (e.g. "sac") can act in `space`, the action space
    of its batch environment: a `Box` with finite bounds (which the wrappers and
    `batchrl.spaces` map onto [-1, 1], where a tanh actor's actions lie), or the
    `FlatActionSpace` of a `Dict` / `Tuple` of such leaves.

    Raises:
      ValueError: one line naming the first leaf that is not a `Box` (a `Discrete`,
        `MultiDiscrete` or `MultiBinary` leaf, which a continuous actor cannot choose) or
        has an infinite bound (which actions in (-1, 1) could never explore).
    """
    if isinstance(space, nested.FlatActionSpace):
        named = [(nested.leaf_name("action", leaf.path), leaf.space) for leaf in space.leaves]
    else:
        named = [("action", space)]
    for where, leaf in named:
        if not isinstance(leaf, gym.spaces.Box):
            problem = f"{where} is {leaf}"
        elif not (np.isfinite(leaf.low).all() and np.isfinite(leaf.high).all()):
            problem = f"{where} is {leaf}, with an infinite bound"
        else:
            continue
        raise ValueError(f"{name} needs Box actions with finite bounds; {problem}")


class OffPolicyAlgorithm(Algorithm):
    """The `begin_episodes / perform / experience / end_episodes` of an algorithm that
    learns from a replay memory; a subclass adds its networks and the update
    (`_update_step`).

    `perform` acts through the subclass's `actor_class` (its `explore` action while
    training, with the config's `exploration` on top; `greedy` otherwise). While `is_training` is
    true, `experience` stores the batch step's transitions in the `ReplayMemory` (n-step
    returns that stop at terminations and bootstrap at truncations) and, once the memory
    holds `learning_starts` transitions, runs `updates_per_step` updates per agent stepped
    (a fractional ratio carries its remainder to the next step) on sampled batches of
    `batch_size`, inside the same graph call (`_update`, compiled with XLA when
    `jit_update`): each calls `update(batch)` on a batch sampled from the replay memory
    and, with prioritized replay, sets the sampled transitions' priorities from the
    `td_error` (`TD_ERROR`) entry of its result. `end_episodes` has nothing to do:
    transitions are stored as they come; `begin_episodes` stores those of an episode cut
    short (truncated).

    Observations are normalized with running statistics when `normalize_observ` (stored
    raw, normalized when acting and when sampled); rewards are used as they are. With
    `prioritized_replay`, the importance-sampling exponent anneals linearly from its
    `beta` to 1 over the run's `steps` (`_beta`).

    Args:
      batch_env: an in-graph batch environment (its `terminated` variable tells
        terminations from truncations).
      step: the global step variable (environment steps; drives exploration schedules
        and the annealing of prioritized replay's beta).
      is_training, should_log: bool scalar tensors or variables.
      config: with `discount`, `normalize_observ`, `observ_clip`, `replay_capacity`,
        `learning_starts`, `updates_per_step`, `batch_size` (None: the subclass's
        `default_batch_size`), `n_step`, `prioritized_replay` (None or `{alpha, beta,
        epsilon}`), `replay_frame_stack` (None or `{frames, axis, window}`: stacked uint8
        frames kept once, `ReplayMemory`'s `frame_stack`), `save_replay` (read by the
        train command: `checkpoint_state`),
        `exploration` (None: the `default_exploration` of the subclass's `actor_class`),
        `target_update_rate`
        and `target_update_every` (None: the subclass's `default_target_update_rate` and
        `default_target_update_every`), `policy_lr`, `value_lr`, `max_gradient_norm`,
        `jit_update`, `log_every`, `policy_layers`, `value_layers`, `activation`, `seed`,
        `steps`; optional `normalize_keys` as for
        `batchrl.algorithms.on_policy.OnPolicyAlgorithm`.

    Raises:
      ValueError: a bad `exploration`, `prioritized_replay` or `replay_frame_stack` spec, or
        an action space the algorithm cannot act in (not `Discrete` for DQN; for SAC and
        TD3 a leaf that is not a `Box` with finite bounds, `check_box_actions`); the ranges
        of the other keys are checked by `configs.load`.
    """

    name = "off_policy"
    discrete_actions = False  # Whether the algorithm acts with Discrete or with Box actions.
    default_batch_size = 256
    # The acting half (`batchrl.algorithms.actor.OffPolicyActor`): policy model, observation
    # filter, exploration, and the critic of the TD error (its `critic_class`); `perform`
    # and `policy_action` act through it (`actor`), the update reads its critic.
    actor_class = None
    actors = "transitions"  # Ape-X (`batchrl.distributed.transitions`).
    # Polyak averaging every update at rate 0.005 (Fujimoto et al. 2018, sec. 6.1; Haarnoja
    # et al. 2018, arXiv:1812.05905, table 1).
    default_target_update_rate = 0.005
    default_target_update_every = 1
    config_keys = frozenset({
        "discount", "normalize_observ", "observ_clip", "replay_capacity", "learning_starts",
        "updates_per_step", "batch_size", "n_step", "prioritized_replay",
        "replay_frame_stack", "save_replay",
        "exploration", "target_update_rate", "target_update_every", "policy_lr", "value_lr",
        "max_gradient_norm", "jit_update",
        "rollout_length"})  # Read by the Ape-X actors: the steps of an actor's call.
    state_size = 0  # Feed-forward policies only.

    def __init__(self, batch_env, step, is_training, should_log, config):
        super().__init__(batch_env, step, is_training, should_log, config)
        self._optimizers = {}  # Checkpoint key -> optimizer module (`_adam`).
        defaults = {"target_update_rate": self.default_target_update_rate,
                    "target_update_every": self.default_target_update_every}
        config = self._config = type(config)(config, **{
            key: value for key, value in defaults.items() if config.get(key) is None})
        self._num_agents = len(batch_env)
        self._observ_shape = tuple(batch_env.observ.shape[1:])
        self._action_shape = tuple(batch_env.action.shape[1:])
        self._discrete = not batch_env.action.dtype.is_floating
        if self._discrete != self.discrete_actions or (
                self._discrete and self._action_shape != ()):
            raise ValueError(
                f"{self.name} needs a Discrete action space; use sac or td3 for Box actions"
                if self.discrete_actions else
                f"{self.name} needs continuous (Box) actions; use dqn for Discrete ones")
        if not self.discrete_actions:
            check_box_actions(self.name, batch_env.action_space)
        self._batch_size = int(config.batch_size or self.default_batch_size)
        self._random = tf.random.Generator.from_seed(config.seed)
        self._acting = self.actor_class(
            batch_env.observation_space, batch_env.action_space, config, self._random, step,
            self._observ_shape, batch_env.observ.dtype, self._num_agents, self._action_shape,
            defer_policy=True)
        self._observ_filter = self._acting.observ_filter
        self._exploration = self._acting.exploration
        self._memory = ReplayMemory(
            *transition_specs(batch_env), int(config.replay_capacity), self._num_agents,
            n_step=int(config.n_step),
            discount=float(config.discount), prioritized=config.prioritized_replay,
            seed=config.seed + 1, byte_elements=getattr(
                batch_env.observation_space, "byte_valued", None),
            frame_stack=config.get("replay_frame_stack"))
        with tf.name_scope(self.name):
            # Updates owed: updates_per_step per transition, whole ones run at once.
            self._debt = tf.Variable(0.0, trainable=False, name="update_debt")
            self._updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
            self._logged_at = tf.Variable(
                tf.constant(-(2 ** 62), tf.int64), trainable=False, name="logged_at")
        self._networks = self._build_networks(batch_env, config)
        self._update = self._compile(self._update_many)
        (observ_shape, observ_dtype), (action_shape, action_dtype) = (
            self._memory.observ_spec, self._memory.action_spec)
        rows = tf.TensorSpec([None], tf.float32)
        self._learn_transitions = tf.function(self._insert_and_update, input_signature=[
            {"observ": tf.TensorSpec((None,) + observ_shape, observ_dtype),
             "action": tf.TensorSpec((None,) + action_shape, action_dtype),
             "reward": rows, "discount": rows,
             "nextob": tf.TensorSpec((None,) + observ_shape, observ_dtype)},
            rows, tf.TensorSpec([], tf.int32)], autograph=False)

    # --- What a subclass provides. ---

    def _build_networks(self, batch_env, config):
        """Builds the networks (the policy with `self._acting.build_policy()`, then the
        Q functions and targets of the TD error with `self._acting.build_critic()`) and
        the optimizers (`_adam`); returns their `batchrl.networks.Networks` (`policy`: the
        model `export` saves; `critic`)."""
        raise NotImplementedError

    def _adam(self, key, learning_rate, variables, max_gradient_norm=None):
        """`adam`'s optimizer for `variables`, its Keras optimizer kept in
        `checkpoint_state` under `key` (e.g. "policy_optimizer")."""
        self._optimizers[key] = adam(learning_rate, variables, max_gradient_norm)
        return self._optimizers[key]

    def _update_step(self, batch):
        """One gradient update on a batch (dict of `update`'s keys, with normalized
        float32 `observ` and `nextob`); returns `(diagnostics, td_error)`: a dict of
        float32 scalars and float32 `[batch_size]` for the priorities."""
        raise NotImplementedError

    @property
    def _trackables(self):
        """The networks and targets (and other variables it learns), for the checkpoint:
        the policy and what its critic built (`Critic.trackables`); its optimizers are
        `_adam`'s."""
        return {"policy": self._acting.policy, **self._acting.critic.trackables}

    # --- The interface of simulate, export and the Agent. ---

    @property
    def checkpoint_state(self):
        """Trackables that define training: the networks, targets and optimizers, the
        normalizer, the random generator and the update counters. Not the replay memory
        (`progress_state`), which can be large: with `save_replay: true` the train command
        keeps it once per run directory, beside the latest checkpoint
        (`batchrl.drivers.Loop`'s `replay`), not in every checkpoint."""
        optimizers = {key: module.optimizer for key, module in self._optimizers.items()}
        return dict(self._trackables, **optimizers, observ_filter=self._observ_filter,
                    random=self._random, update_debt=self._debt, updates=self._updates)

    @property
    def progress_state(self):
        """What `checkpoint_state` leaves out and an exactly continued Agent needs
        (`batchrl.Agent.save`): the replay memory (`replay`) and the exploration's noise
        state."""
        return {"exploration": self._exploration, "replay": self._memory}

    @property
    def updates(self):
        """int64 variable, the gradient updates done."""
        return self._updates

    @property
    def memory(self):
        """The `ReplayMemory`."""
        return self._memory

    @property
    def batch_size(self):
        """int, the transitions of one update's batch."""
        return self._batch_size

    def learn(self, recording, log=False):
        """The Ape-X learner's step on an actor's recording
        (`batchrl.distributed.transitions.TransitionRecorder.record`): stores its ready
        n-step transitions with their TD errors for their first priorities
        (`ReplayMemory.insert`), updates the observation filter with their observations,
        and runs the updates that the recording's environment steps are owed
        (`updates_per_step` each once the memory holds `learning_starts`; the fraction
        carried), as `experience` does for stepped ones, with the same summaries (while
        `should_log`, at most once per `log_every` steps of the global step, which the
        caller advances by the recording's steps first; `log` is not read).

        Args:
          recording: dict of `transitions` (dict of `observ`, `nextob`
            `[n, *observation_shape]`, `action` `[n, *action_shape]`, `reward` and
            `discount` float32 `[n]`, NumPy arrays or tensors; `n` may change from call to
            call), `td_error` float32 `[n]` and `length` int `[B]` (the steps of each of
            the actor's agents: their sum is the environment steps owed updates).
          log: ignored (see above).

        Returns:
          dict: `updates`, int, the updates run.
        """
        del log
        transitions = recording["transitions"]
        before = int(self._updates.numpy())
        self._learn_transitions(
            {key: transitions[key] for key in ("observ", "action", "reward", "discount",
                                                 "nextob")},
            recording["td_error"], tf.constant(int(np.sum(recording["length"])), tf.int32))
        return {"updates": int(self._updates.numpy()) - before}

    def policy_action(self, observ, state, generator=None):
        """The action for raw observations (float32 `[n, *observation_shape]`) without
        exploration and changing no variable; with `generator`, the exported `sample`
        action. Returns `(action, state)` (the state, `[n, 0]`, passes through)."""
        normalized = self._observ_filter.transform(observ)
        if generator is None:
            return self._acting.greedy(normalized), state
        return self._acting.sampled(normalized, generator), state

    def begin_episodes(self, agent_indices):
        """Zeroes the given agents' exploration noise (int32 `[n]`) and stores the steps
        still waiting in their n-step windows as a truncated episode's
        (`ReplayMemory.reset_agents`): an episode cut short where a phase, the Agent's
        deterministic `act` or `reset`, or a dropped episode begins new ones. Whatever
        `is_training`: the windows hold training steps only (`experience` adds none
        otherwise), and their updates were counted when they were added."""
        agent_indices = tf.cast(agent_indices, tf.int32)
        return after([self._memory.reset_agents(agent_indices),
                      self._exploration.reset(agent_indices)], True)

    def perform(self, agent_indices, observ):
        """Actions for the given agents (int32 `[n]`, raw observations `[n, ...]`): explored
        while training, greedy otherwise; `[n, *action_shape]`.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        with tf.name_scope("perform"):
            action, _ = self._acting.act(observ, None, self._is_training, agent_indices)
            return checked(action)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Stores the transitions of the given agents while training, then runs the
        updates they are owed (see the class docstring). Shapes as `perform`'s; reward
        float32 `[n]`, done bool `[n]`, nextob the observation after the step (the final
        one when the episode ended)."""
        return self._while_training(
            self._record, agent_indices, observ, action, reward, done, nextob)

    def end_episodes(self, agent_indices):
        """Nothing to do: transitions are stored by `experience`."""
        del agent_indices
        return tf.constant(True)

    def add_transitions(self, transitions):
        """Stores external one-step transitions (demonstrations, logged data) and runs the
        updates they are owed, as for stepped ones (`Agent.update`).

        Args:
          transitions: dict of `observ` (raw, `[n, *observation_shape]`), `action`
            (`[n, *action_shape]`), `reward` float32 `[n]`, `terminated` bool `[n]` and
            `nextob` (`[n, ...]`, the observation after the step).

        Returns:
          bool scalar tensor to wait for.
        """
        terminated = tf.cast(transitions["terminated"], tf.float32)
        ready = {
            "observ": transitions["observ"], "action": transitions["action"],
            "reward": tf.cast(transitions["reward"], tf.float32),
            "discount": self._config.discount * (1.0 - terminated),
            "nextob": transitions["nextob"],
        }
        inserted = [self._memory.insert(ready),
                    self._observ_filter.update(tf.cast(transitions["observ"], tf.float32))]
        with tf.control_dependencies(inserted):
            return self._owed_updates(tf.shape(terminated)[0])

    # --- Inside. ---

    def _insert_and_update(self, transitions, td_error, steps):
        """`learn`'s compiled function."""
        inserted = [self._memory.insert(transitions, td_error=td_error),
                    self._observ_filter.update(tf.cast(transitions["observ"], tf.float32))]
        with tf.control_dependencies(inserted):
            return self._owed_updates(steps)

    def _record(self, agent_indices, observ, action, reward, done, nextob):
        with tf.name_scope("experience"):
            agent_indices = tf.cast(agent_indices, tf.int32)
            terminated = tf.gather(self._batch_env.terminated, agent_indices)
            truncated = tf.logical_and(done, tf.logical_not(terminated))
            stored = [
                self._memory.add(agent_indices, observ, action, reward, terminated,
                                 truncated, nextob),
                self._observ_filter.update(observ)]
            with tf.control_dependencies(stored):
                return self._owed_updates(tf.shape(agent_indices)[0])

    def _owed_updates(self, transitions):
        """Adds `updates_per_step` per transition to the debt once the memory holds
        `learning_starts`, and runs the whole updates owed; returns True once done."""
        ready = self._memory.size >= int(self._config.learning_starts)
        owed = tf.cast(transitions, tf.float32) * float(self._config.updates_per_step)
        debt = self._debt.assign_add(tf.where(ready, owed, 0.0))
        count = tf.cast(tf.floor(debt), tf.int32)
        with tf.control_dependencies([self._debt.assign_sub(tf.cast(count, tf.float32))]):
            return tf.cond(count > 0, lambda: self._train(count), lambda: tf.constant(False))

    def _train(self, count):
        """Runs `count` updates (`_update`) and writes the last one's diagnostics as
        scalars under `NAME/`, with `replay_size` and, when prioritized, `beta` (`_beta`),
        at most once per `log_every` environment steps."""
        with tf.name_scope("update"):
            diagnostics = self._update(count)
            due = tf.logical_and(
                tf.convert_to_tensor(self._should_log),
                self._step >= self._logged_at + int(self._config.log_every))

            def replay():
                written = [tf.summary.scalar(
                    "replay_size", tf.cast(self._memory.size, tf.float32))]
                if self._memory.prioritized:
                    written.append(tf.summary.scalar("beta", self._beta()))
                return written

            summaries = self._write_summaries(diagnostics, due, replay, (self._observ_filter,))
            with tf.control_dependencies(summaries):
                logged = self._logged_at.assign(tf.where(due, self._step, self._logged_at))
            return after([logged], True)

    def _update_many(self, count):
        """`count` (int32 scalar >= 1) updates; returns the last one's diagnostics."""
        first = self._sampled_update()

        def body(index, diagnostics):
            del diagnostics
            return index + 1, self._sampled_update()

        _, diagnostics = tf.while_loop(
            lambda index, _: index < count, body, (tf.constant(1), first))
        return diagnostics

    def update(self, batch):
        """One gradient update (the subclass's `_update_step`), counted in `updates`.

        Args:
          batch: dict of `ReplayMemory.sample`'s keys without `index`: `observ` and
            `nextob` raw `[batch_size, *observation_shape]` (normalized here), `action`
            `[batch_size, *action_shape]`, `reward` and `discount` float32 `[batch_size]`
            (the n-step return and the discount of the bootstrap, 0 after a termination),
            `weight` float32 `[batch_size]` (importance weights; ones without priorities).

        Returns:
          dict of float32 scalars (the diagnostics the subclass documents) and `td_error`
          (`TD_ERROR`), float32 `[batch_size]`, the absolute TD errors that prioritized
          replay sets the priorities from.
        """
        batch = dict(batch, observ=self._normalized(batch["observ"]),
                     nextob=self._normalized(batch["nextob"]))
        diagnostics, td_error = self._update_step(batch)
        counted = [self._updates.assign_add(1)]
        return dict({key: after(counted, value) for key, value in diagnostics.items()},
                    **{TD_ERROR: td_error})

    def _sampled_update(self):
        """`update` on a batch sampled from the replay memory; with prioritized replay,
        the sampled transitions' priorities set from its `td_error`. Returns the
        diagnostics."""
        beta = self._beta() if self._memory.prioritized else None
        batch = self._memory.sample(self._batch_size, beta=beta)
        diagnostics = self.update(batch)
        td_error = diagnostics.pop(TD_ERROR)
        if not self._memory.prioritized:
            return diagnostics
        done = [self._memory.update_priorities(batch["index"], td_error)]
        return {key: after(done, value) for key, value in diagnostics.items()}

    def _beta(self):
        """The importance-sampling exponent of prioritized replay at the current step:
        `beta + (1 - beta) min(step / steps, 1)`, linear from the configured `beta` to 1
        over the run's `steps` environment steps and 1 from there (Schaul et al. 2016,
        arXiv:1511.05952, sec. 3.4); float32 scalar. Only with `prioritized_replay`."""
        return annealed_beta(self._memory.prioritized["beta"], self._step,
                             self._config.steps)

    def _normalized(self, observ):
        return self._observ_filter.transform(tf.cast(observ, tf.float32))

    def _update_targets(self, pairs):
        """Every `target_update_every` updates, moves each target towards its online
        network by `target_update_rate` (`polyak`); `pairs` of (target, online) models."""
        config = self._config

        def update():
            return after([op for target, online in pairs for op in polyak(
                target.variables, online.variables, config.target_update_rate)], True)

        due = tf.equal((self._updates + 1) % int(config.target_update_every), 0)
        return tf.cond(due, update, lambda: tf.constant(False))



def transition_specs(batch_env):
    """`(observ_spec, action_spec)`, each `(shape, dtype)`: how one transition of the
    in-graph `batch_env` is stored, in the replay memory and in an Ape-X actor's outbox
    alike. Observations of a `Box` of one-byte integers (images) keep that dtype; others
    that of the batch's observations."""
    dtype = getattr(batch_env.observation_space, "dtype", None)
    observ_dtype = batch_env.observ.dtype
    if dtype is not None and tf.as_dtype(dtype).is_integer and tf.as_dtype(dtype).size == 1:
        observ_dtype = tf.as_dtype(dtype)
    return ((tuple(batch_env.observ.shape[1:]), observ_dtype),
            (tuple(batch_env.action.shape[1:]), batch_env.action.dtype))

"""BatchPPO: proximal policy optimization inside the TensorFlow graph.

Hafner, Davidson, Vanhoucke, "TensorFlow Agents: Efficient Batched Reinforcement Learning
in TensorFlow", arXiv:1709.02878, section 4; Schulman et al., arXiv:1707.06347 (PPO with an
adaptive KL penalty); Heess et al., arXiv:1707.02286 (streaming normalization, KL cut-off).
"""

import keras
import tensorflow as tf

from batchrl.algorithms.ppo import advantage as advantage_lib
from batchrl.algorithms.ppo import losses
from batchrl.algorithms.ppo.memory import EpisodeMemory
from batchrl.tools import nested
from batchrl.tools.streaming import StreamingNormalize


def _after(dependencies, value):
    with tf.control_dependencies([d for d in dependencies if d is not None]):
        return tf.identity(value)


class PPO:
    """Proximal policy optimization with an adaptive KL penalty, as graph code.

    While `is_training` is true, `experience` appends each agent's transitions to its
    current episode and updates the observation and reward normalizers; `end_episodes`
    moves finished episodes into a memory of `update_every` episodes (further episodes that
    end at the same step are dropped) and, once it is full, trains. The memory's episodes
    are cut into chunks of `chunk_length` consecutive steps (null: whole episodes); each of
    `update_epochs` epochs shuffles the chunks and takes one Adam step on the value loss and
    one on the policy's penalized surrogate loss per minibatch of `batch_size` chunks
    (null: all chunks, one full-batch step per epoch). Then the KL penalty is adapted from
    the KL between the reference policy and the new one, and the memory is emptied. While
    `is_training` is false, `perform` returns the mode (mean) action and nothing is
    recorded.

    A recurrent policy (`policy.state_size > 0`) keeps one state per agent, reset to zero
    in `begin_episodes` and advanced in `perform`; the state each step was acted on is
    stored with the step, and a chunk is replayed from the state stored at its first step.

    Observations are normalized with a running mean and standard deviation and clipped to
    [-observ_clip, observ_clip], element by element (for a flattened nested observation,
    `batchrl.tools.nested.FlatObservationSpace`, only the elements of its `Box` leaves: the
    one-hot and binary elements stay 0 / 1); rewards are scaled by a running standard deviation and
    clipped to [-reward_clip, reward_clip] (each switchable in the config). The standard
    deviation is that of the rewards (`reward_normalizer: reward`, Hafner et al.) or of each
    agent's discounted return so far, r_t + discount * R_{t-1} from the start of its episode
    (`reward_normalizer: return`, the "reward scaling" of Engstrom et al., "Implementation
    Matters in Deep Policy Gradients", ICLR 2020, section 3). The policy loss
    may add an entropy bonus (`entropy_coef`); both learning rates may decay linearly to 0
    over the run's `steps` (`lr_schedule`). Advantages are GAE(lambda), normalized over
    the memory; value targets are lambda-returns; the value after the last step of an
    episode is bootstrapped from its final observation when the episode was truncated and
    zero when it terminated.

    The importance ratio of the surrogate is always taken against the stored policy that
    acted (its parameters are stored with every step). The KL penalty, the cut-off and the
    penalty's adaptation measure the KL from the reference policy `kl_reference`:
    `behaviour`, that same stored policy (Hafner et al.), or `update_start`, the policy as
    it was when this update began, evaluated on the memory's observations (the paper's
    pi_old). The two differ for episodes that began before the previous update.

    Args:
      batch_env: an `InGraphBatchEnv` (its `terminated` variable tells terminal states).
      step: the global step variable (summaries are written at its value).
      is_training: bool scalar tensor or variable.
      should_log: bool scalar tensor or variable; summaries are recorded only when true.
      config: object with the attributes `network` (a constructor from
        `batchrl.networks`), `max_length`, `update_every`, `update_epochs`,
        `policy_lr`, `value_lr`, `discount`, `gae_lambda`, `kl_target`,
        `kl_cutoff_factor`, `kl_cutoff_coef`, `kl_init_penalty`, `normalize_observ`,
        `normalize_reward`, `max_gradient_norm` (None for no clipping), `chunk_length`,
        `batch_size` (None for whole episodes and full batches), `kl_reference`
        (`behaviour` or `update_start`), `jit_update` (compile the update with XLA),
        `observ_clip`, `reward_clip`, `reward_normalizer` (`reward` or `return`),
        `entropy_coef`, `lr_schedule` (`constant` or
        `linear`), `steps` and `seed`, plus whatever the network reads.
    """

    def __init__(self, batch_env, step, is_training, should_log, config):
        self._batch_env = batch_env
        self._step = step
        self._is_training = is_training
        self._should_log = should_log
        self._config = config
        num_agents = len(batch_env)
        observ_shape = tuple(batch_env.observ.shape[1:])
        action_shape = tuple(batch_env.action.shape[1:])
        self._networks = config.network(
            batch_env.observation_space, batch_env.action_space, config)
        self._distribution = self._networks.distribution
        self._observ_filter = StreamingNormalize(
            observ_shape, center=config.normalize_observ, scale=config.normalize_observ,
            clip=config.observ_clip if config.normalize_observ else None,
            mask=nested.normalized_elements(batch_env.observation_space),
            name="normalize_observ")
        self._reward_filter = StreamingNormalize(
            (), center=False, scale=config.normalize_reward,
            clip=config.reward_clip if config.normalize_reward else None,
            name="normalize_reward")

        self._state_size = int(self._networks.policy.state_size)
        self._recurrent = self._state_size > 0
        params, _ = self._networks.policy(
            tf.zeros((1, 1) + observ_shape), tf.zeros((1, self._state_size)))
        self._param_shapes = {key: tuple(value.shape[2:]) for key, value in params.items()}
        self._chunk_length = config.chunk_length or config.max_length
        # Episodes are stored padded to a whole number of chunks.
        chunks = -(-config.max_length // self._chunk_length)
        self._memory_length = chunks * self._chunk_length
        template = {
            "observ": (observ_shape, tf.float32),
            "action": (action_shape, batch_env.action.dtype),
            "reward": ((), tf.float32),
        }
        if self._recurrent:
            template["state"] = ((self._state_size,), tf.float32)
        for key, shape in self._param_shapes.items():
            template["policy_" + key] = (shape, tf.float32)
        with tf.name_scope("ppo"):
            self._episodes = EpisodeMemory(
                template, num_agents, self._memory_length, "episodes")
            self._memory = EpisodeMemory(
                template, config.update_every, self._memory_length, "memory")
            # Recurrent state of each agent, and the state its last action was taken in.
            self._state = tf.Variable(
                tf.zeros((num_agents, self._state_size)), trainable=False, name="state")
            self._last_state = tf.Variable(
                tf.zeros((num_agents, self._state_size)), trainable=False, name="last_state")
            self._last_params = {
                key: tf.Variable(tf.zeros((num_agents,) + shape), trainable=False,
                                 name="last_" + key)
                for key, shape in self._param_shapes.items()}
            # Normalized final observation and terminal flag of each agent's episode, and
            # of each episode in the memory: what the value bootstraps from.
            self._episode_final = tf.Variable(
                tf.zeros((num_agents,) + observ_shape), trainable=False, name="episode_final")
            self._episode_terminated = tf.Variable(
                tf.zeros([num_agents], tf.bool), trainable=False, name="episode_terminated")
            self._memory_final = tf.Variable(
                tf.zeros((config.update_every,) + observ_shape), trainable=False,
                name="memory_final")
            self._memory_terminated = tf.Variable(
                tf.zeros([config.update_every], tf.bool), trainable=False,
                name="memory_terminated")
            self._memory_index = tf.Variable(0, dtype=tf.int32, trainable=False,
                                             name="memory_index")
            self._penalty = tf.Variable(float(config.kl_init_penalty), dtype=tf.float32,
                                        trainable=False, name="kl_penalty")
            # Each agent's discounted return since its episode began (reward_normalizer:
            # return); rebuilt by playing, like the episodes in progress.
            self._return = tf.Variable(
                tf.zeros([num_agents]), trainable=False, name="discounted_return")
        self._random = tf.random.Generator.from_seed(config.seed)
        self._policy_optimizer = keras.optimizers.Adam(config.policy_lr)
        self._policy_optimizer.build(self._networks.policy.trainable_variables)
        self._value_optimizer = keras.optimizers.Adam(config.value_lr)
        self._value_optimizer.build(self._networks.value.trainable_variables)
        # The update is a function of its own, traced once however many step functions
        # call it. With `jit_update`, XLA compiles its many small ops (minibatch steps of
        # small networks) into a few kernels; summaries stay outside, in `_train`.
        self._update = tf.function(
            self._update_step, jit_compile=bool(config.jit_update), autograph=False)

    @property
    def checkpoint_state(self):
        """Trackables that define training, for `tf.train.Checkpoint(**checkpoint_state)`.

        Episodes in progress, the recurrent states and the memory are left out: they are
        rebuilt by playing (every phase of the Loop begins new episodes for all agents).
        """
        return {
            "policy": self._networks.policy,
            "value": self._networks.value,
            "policy_optimizer": self._policy_optimizer,
            "value_optimizer": self._value_optimizer,
            "observ_filter": self._observ_filter,
            "reward_filter": self._reward_filter,
            "kl_penalty": self._penalty,
            "random": self._random,
        }

    @property
    def progress_state(self):
        """Trackables of the training in progress that `checkpoint_state` leaves out: the
        episodes in progress and the memory, the recurrent states, the stored policy
        parameters and the discounted returns. With them a restored algorithm continues
        exactly (`batchrl.Agent.save`); the Loop does without (every phase begins new
        episodes)."""
        return {
            "episodes": self._episodes,
            "memory": self._memory,
            "memory_final": self._memory_final,
            "memory_terminated": self._memory_terminated,
            "memory_index": self._memory_index,
            "episode_final": self._episode_final,
            "episode_terminated": self._episode_terminated,
            "state": self._state,
            "last_state": self._last_state,
            "last_params": dict(self._last_params),
            "discounted_return": self._return,
        }

    @property
    def networks(self):
        return self._networks

    @property
    def state_size(self):
        """int, the size of the policy's recurrent state (0 for a feed-forward policy)."""
        return self._state_size

    def policy_action(self, observ, state, generator=None):
        """The policy's action for raw observations, changing no variable: for acting
        outside of training and for exported models.

        Args:
          observ: float32 `[n, *observation_shape]`, raw (unnormalized) observations.
          state: float32 `[n, state_size]`, the recurrent states (`[n, 0]` for a
            feed-forward policy).
          generator: a `tf.random.Generator` to sample the action with; None: the mode
            (mean) action.

        Returns:
          `(action, state)`: `[n, *action_shape]` and the next recurrent states.
        """
        normalized = self._observ_filter.transform(observ)
        params, state = self._networks.policy(normalized[:, None], state)
        distribution = self._distribution({key: value[:, 0] for key, value in params.items()})
        action = distribution.mode() if generator is None else distribution.sample(generator)
        return action, state

    def begin_episodes(self, agent_indices):
        """Empties the current episode and zeroes the recurrent state of the given agents
        (int32 `[n]`)."""
        rows = tf.cast(agent_indices, tf.int32)[:, None]
        cleared = [self._episodes.clear(agent_indices),
                   self._return.scatter_nd_update(rows, tf.zeros([tf.shape(rows)[0]]))]
        if self._recurrent:
            zeros = tf.zeros([tf.shape(rows)[0], self._state_size])
            cleared.append(self._state.scatter_nd_update(rows, zeros))
        return _after(cleared, True)

    def perform(self, agent_indices, observ):
        """Actions for the given agents: sampled while training, the mode otherwise.

        Args:
          agent_indices: int32 `[n]`.
          observ: float32 `[n, *observation_shape]`, raw observations.

        Returns:
          actions `[n, *action_shape]`.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        with tf.name_scope("perform"):
            agent_indices = tf.cast(agent_indices, tf.int32)
            normalized = self._observ_filter.transform(observ)
            state = tf.gather(self._state, agent_indices)
            params, new_state = self._networks.policy(normalized[:, None], state)
            params = {key: value[:, 0] for key, value in params.items()}
            distribution = self._distribution(params)
            action = tf.cond(
                tf.convert_to_tensor(self._is_training),
                lambda: distribution.sample(self._random),
                distribution.mode)
            if action.dtype.is_floating:
                action = tf.debugging.check_numerics(action, "non-finite action")
            rows = agent_indices[:, None]
            stored = [self._last_params[key].scatter_nd_update(rows, params[key])
                      for key in self._param_shapes]
            if self._recurrent:
                stored.append(self._last_state.scatter_nd_update(rows, state))
                with tf.control_dependencies(stored):
                    stored.append(self._state.scatter_nd_update(rows, new_state))
            return _after(stored, action)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Records a transition of the given agents while training.

        Args:
          agent_indices: int32 `[n]`.
          observ: float32 `[n, *observation_shape]`, the observation the action was taken in.
          action: `[n, *action_shape]`.
          reward: float32 `[n]`.
          done: bool `[n]` (unused: terminal states are read from the environment).
          nextob: float32 `[n, *observation_shape]`, the observation after the step.
        """
        del done
        return tf.cond(
            tf.convert_to_tensor(self._is_training),
            lambda: self._record(agent_indices, observ, action, reward, nextob),
            lambda: tf.constant(False))

    def _record(self, agent_indices, observ, action, reward, nextob):
        with tf.name_scope("experience"):
            agent_indices = tf.cast(agent_indices, tf.int32)
            normalized = self._observ_filter.transform(observ)
            normalized_next = self._observ_filter.transform(nextob)
            rows = agent_indices[:, None]
            with tf.control_dependencies([normalized, normalized_next]):
                statistics = [self._observ_filter.update(observ),
                              self._reward_filter.update(self._reward_statistic(rows, reward))]
            transition = {"observ": normalized, "action": action, "reward": reward}
            if self._recurrent:
                transition["state"] = tf.gather(self._last_state, agent_indices)
            for key in self._param_shapes:
                transition["policy_" + key] = tf.gather(self._last_params[key], agent_indices)
            terminated = tf.gather(self._batch_env.terminated, agent_indices)
            stored = [
                self._episodes.append(transition, agent_indices),
                self._episode_final.scatter_nd_update(rows, normalized_next),
                self._episode_terminated.scatter_nd_update(rows, terminated),
            ]
            return _after(statistics + stored, True)

    def _reward_statistic(self, rows, reward):
        """What the reward normalizer's standard deviation is taken of: the rewards, or
        the agents' discounted returns so far (updated here)."""
        if self._config.reward_normalizer == "reward":
            return reward
        returns = self._config.discount * tf.gather_nd(self._return, rows) + reward
        return _after([self._return.scatter_nd_update(rows, returns)], returns)

    def end_episodes(self, agent_indices):
        """Moves the finished episodes of the given agents into the memory while training,
        and trains once the memory holds `update_every` episodes."""
        return tf.cond(
            tf.convert_to_tensor(self._is_training),
            lambda: self._store(agent_indices),
            lambda: tf.constant(False))

    def _store(self, agent_indices):
        with tf.name_scope("end_episodes"):
            agent_indices = tf.cast(agent_indices, tf.int32)
            free = self._config.update_every - self._memory_index
            used = agent_indices[:free]
            rows = self._memory_index + tf.range(tf.shape(used)[0])
            episodes, length = self._episodes.data(used)
            stored = [
                self._memory.replace(episodes, length, rows),
                self._memory_final.scatter_nd_update(
                    rows[:, None], tf.gather(self._episode_final, used)),
                self._memory_terminated.scatter_nd_update(
                    rows[:, None], tf.gather(self._episode_terminated, used)),
            ]
            with tf.control_dependencies(stored):
                count = self._memory_index.assign_add(tf.shape(used)[0])
            return tf.cond(count >= self._config.update_every, self._train,
                           lambda: tf.constant(False))

    def _train(self):
        """One PPO update on the full memory and its summaries; returns True once done."""
        with tf.name_scope("update"):
            result = self._update()
            mask = result.pop("mask")
            advantage = result.pop("advantage")
            action = result.pop("action")
            with tf.summary.record_if(self._should_log), tf.name_scope("ppo/"):
                summaries = [tf.summary.scalar(name, value) for name, value in result.items()]
                summaries += [
                    tf.summary.histogram("advantage", tf.boolean_mask(advantage, mask > 0)),
                    tf.summary.histogram("action", tf.cast(
                        tf.boolean_mask(action, mask > 0), tf.float32)),
                ]
                self._observ_filter.summary()
                self._reward_filter.summary()
            return _after(summaries, True)

    def _update_step(self):
        """The update itself (see the class docstring), free of summaries so that XLA can
        compile it; empties the memory.

        Returns:
          dict of float32 scalars for the summaries (`kl`, `kl_penalty`, `entropy`,
          `mean_return`, the losses and gradient norms of `_optimize`), and the tensors
          `mask`, `advantage` and `action` of the memory, `[update_every, memory_length,
          ...]`, for the histograms.
        """
        config = self._config
        scheduled = self._schedule_learning_rates()
        with tf.control_dependencies(scheduled):
            episodes, length = self._memory.data()
        mask = advantage_lib.sequence_mask(length, self._memory_length)
        observ = episodes["observ"]
        reward = self._reward_filter.transform(episodes["reward"]) * mask
        not_terminal = 1.0 - tf.cast(self._memory_terminated, tf.float32)
        value = self._networks.value(observ)
        bootstrap = self._networks.value(self._memory_final[:, None])[:, 0] * not_terminal
        advantage, target = advantage_lib.generalized_advantage(
            reward, value, bootstrap, length, config.discount, config.gae_lambda)
        mean = advantage_lib.masked_mean(advantage, mask)
        std = tf.sqrt(advantage_lib.masked_mean(tf.square(advantage - mean), mask))
        behaviour_params = {key: episodes["policy_" + key] for key in self._param_shapes}
        behaviour = self._distribution(behaviour_params)
        if config.kl_reference == "update_start":
            # The paper's pi_old: the policy before this update, on the same observations.
            reference_params = self._replay(observ)
        else:
            reference_params = behaviour_params
        state = episodes["state"] if self._recurrent else tf.zeros(
            [config.update_every, self._memory_length, 0])
        steps = dict(
            observ=observ, action=episodes["action"], state=state,
            mask=mask, target=target, advantage=(advantage - mean) / (std + 1e-8) * mask,
            old_log_prob=behaviour.log_prob(episodes["action"]),
            **{"reference_" + key: value for key, value in reference_params.items()})
        metrics = self._optimize(self._chunks(steps))

        with tf.control_dependencies(tf.nest.flatten(metrics)):
            new = self._distribution(self._replay(observ))
            reference = self._distribution(reference_params)
            kl = advantage_lib.masked_mean(reference.kl(new), mask)
            entropy = advantage_lib.masked_mean(new.entropy(), mask)
            penalty = self._penalty.assign(
                losses.adapted_penalty(self._penalty, kl, config.kl_target))
        with tf.control_dependencies([penalty]):
            cleared = [self._memory.clear(), self._memory_index.assign(0)]
        with tf.control_dependencies(cleared):
            return dict(
                metrics, kl=tf.identity(kl), kl_penalty=tf.identity(penalty),
                entropy=entropy, mean_return=advantage_lib.masked_mean(target, mask),
                mask=mask, advantage=advantage, action=episodes["action"])

    def _schedule_learning_rates(self):
        """With `lr_schedule: linear`, sets both learning rates to their configured value
        times the fraction of the run's `steps` still to train (as in Schulman et al.,
        arXiv:1707.06347, table 3, for MuJoCo); returns the assignments."""
        config = self._config
        if config.lr_schedule != "linear":
            return []
        done = tf.cast(self._step, tf.float32) / float(config.steps)
        remaining = tf.maximum(1.0 - done, 0.0)
        return [optimizer.learning_rate.assign(rate * remaining)
                for optimizer, rate in ((self._policy_optimizer, config.policy_lr),
                                        (self._value_optimizer, config.value_lr))]

    def _replay(self, observ):
        """The current policy's parameters on whole episodes of the memory, replayed from
        the zero state; dict of `[update_every, memory_length, ...]`."""
        params, _ = self._networks.policy(
            observ, tf.zeros([self._config.update_every, self._state_size]))
        return params

    def _chunks(self, steps):
        """Cuts `[episodes, memory_length, ...]` tensors into `[chunks, chunk_length, ...]`."""
        chunk = self._chunk_length
        return {key: tf.reshape(value, tf.concat([[-1, chunk], tf.shape(value)[2:]], 0))
                for key, value in steps.items()}

    def _optimize(self, chunks):
        """`update_epochs` epochs of minibatch Adam steps on the value and the policy.

        Each epoch visits the valid chunks (those with at least one valid step) in a new
        random order, in minibatches of `batch_size` chunks (all of them when None); the
        last minibatch of an epoch may hold fewer. Shapes stay static (the minibatch is
        padded with masked-out rows), so that XLA can compile the loop.

        Returns:
          dict of float32 scalars for the summaries: the losses of the last minibatch and
          the mean gradient norms.
        """
        config = self._config
        capacity = config.update_every * (self._memory_length // self._chunk_length)
        batch = min(config.batch_size or capacity, capacity)
        valid = tf.reduce_sum(chunks["mask"], 1) > 0
        count = tf.reduce_sum(tf.cast(valid, tf.int32))
        batches = (count + batch - 1) // batch
        total = config.update_epochs * batches
        slots = tf.range(batch)
        metrics = {name: tf.constant(0.0) for name in (
            "value_loss", "policy_loss", "surrogate", "kl_cutoff_count",
            "value_gradient_norm", "policy_gradient_norm")}

        def shuffle():
            # Valid chunks first, in random order; `batch` spare rows so that the last
            # minibatch's slice stays inside.
            keys = tf.where(valid, self._random.uniform([capacity]), 2.0)
            return tf.concat([tf.argsort(keys), tf.zeros([batch], tf.int32)], 0)

        def body(index, order, metrics):
            position = index % batches
            order = tf.cond(tf.equal(position, 0), shuffle, lambda: order)
            start = position * batch
            rows = tf.gather(order, start + slots)
            minibatch = {key: tf.gather(value, rows) for key, value in chunks.items()}
            in_range = tf.cast(start + slots < count, tf.float32)
            minibatch["mask"] = minibatch["mask"] * in_range[:, None]
            value_loss, value_norm = self._value_step(minibatch)
            with tf.control_dependencies([value_loss]):
                policy, policy_norm = self._policy_step(minibatch)
            return index + 1, order, {
                "value_loss": value_loss,
                "policy_loss": policy["loss"],
                "surrogate": policy["surrogate"],
                "kl_cutoff_count": policy["cutoff_count"],
                "value_gradient_norm": metrics["value_gradient_norm"] + value_norm,
                "policy_gradient_norm": metrics["policy_gradient_norm"] + policy_norm,
            }

        _, _, metrics = tf.while_loop(
            lambda index, *_: index < total, body,
            (tf.constant(0), tf.zeros([capacity + batch], tf.int32), metrics))
        steps = tf.cast(tf.maximum(total, 1), tf.float32)
        metrics["value_gradient_norm"] /= steps
        metrics["policy_gradient_norm"] /= steps
        return metrics

    def _apply(self, tape, loss, model, optimizer):
        """One optimizer step on `loss`; returns the gradient's global norm before clipping."""
        variables = model.trainable_variables
        gradients = tape.gradient(loss, variables)
        norm = tf.linalg.global_norm(gradients)
        if self._config.max_gradient_norm:
            gradients, _ = tf.clip_by_global_norm(
                gradients, self._config.max_gradient_norm, use_norm=norm)
        optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return norm

    def _value_step(self, minibatch):
        with tf.name_scope("value"), tf.GradientTape() as tape:
            loss = losses.value_loss(
                self._networks.value(minibatch["observ"]), minibatch["target"],
                minibatch["mask"])
        return loss, self._apply(tape, loss, self._networks.value, self._value_optimizer)

    def _policy_step(self, minibatch):
        config = self._config
        reference = self._distribution(
            {key: minibatch["reference_" + key] for key in self._param_shapes})
        with tf.name_scope("policy"), tf.GradientTape() as tape:
            params, _ = self._networks.policy(minibatch["observ"], minibatch["state"][:, 0])
            new = self._distribution(params)
            result = losses.policy_loss(
                new.log_prob(minibatch["action"]), minibatch["old_log_prob"],
                minibatch["advantage"], reference.kl(new), minibatch["mask"], self._penalty,
                config.kl_target, config.kl_cutoff_factor, config.kl_cutoff_coef,
                new.entropy(), config.entropy_coef)
        return result, self._apply(
            tape, result["loss"], self._networks.policy, self._policy_optimizer)

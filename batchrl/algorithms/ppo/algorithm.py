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
from batchrl.tools.streaming import StreamingNormalize


def _after(dependencies, value):
    with tf.control_dependencies([d for d in dependencies if d is not None]):
        return tf.identity(value)


class PPO:
    """Proximal policy optimization with an adaptive KL penalty, as graph code.

    While `is_training` is true, `experience` appends each agent's transitions to its
    current episode and updates the observation and reward normalizers; `end_episodes`
    moves finished episodes into a memory of `update_every` episodes (further episodes that
    end at the same step are dropped) and, once it is full, trains: `update_epochs` Adam
    steps on the value function, then `update_epochs` Adam steps on the policy's penalized
    surrogate loss, both on the whole memory; then the KL penalty is adapted and the memory
    emptied. While `is_training` is false, `perform` returns the mean (mode) action and
    nothing is recorded.

    Observations are normalized with a running mean and standard deviation and clipped to
    [-5, 5]; rewards are scaled by their running standard deviation and clipped to
    [-10, 10] (each switchable in the config). Advantages are GAE(lambda), normalized over
    the memory; value targets are lambda-returns; the value after the last step of an
    episode is bootstrapped from its final observation when the episode was truncated and
    zero when it terminated.

    Args:
      batch_env: an `InGraphBatchEnv` (its `terminated` variable tells terminal states).
      step: the global step variable (summaries are written at its value).
      is_training: bool scalar tensor or variable.
      should_log: bool scalar tensor or variable; summaries are recorded only when true.
      config: object with the attributes `network` (a constructor from
        `batchrl.scripts.networks`), `max_length`, `update_every`, `update_epochs`,
        `policy_lr`, `value_lr`, `discount`, `gae_lambda`, `kl_target`,
        `kl_cutoff_factor`, `kl_cutoff_coef`, `kl_init_penalty`, `normalize_observ`,
        `normalize_reward`, `max_gradient_norm` (None for no clipping) and `seed`, plus
        whatever the network reads.
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
            clip=5.0 if config.normalize_observ else None, name="normalize_observ")
        self._reward_filter = StreamingNormalize(
            (), center=False, scale=config.normalize_reward,
            clip=10.0 if config.normalize_reward else None, name="normalize_reward")

        params = self._networks.policy(tf.zeros((1, 1) + observ_shape))
        self._param_shapes = {key: tuple(value.shape[2:]) for key, value in params.items()}
        template = {
            "observ": (observ_shape, tf.float32),
            "action": (action_shape, batch_env.action.dtype),
            "reward": ((), tf.float32),
        }
        for key, shape in self._param_shapes.items():
            template["policy_" + key] = (shape, tf.float32)
        with tf.name_scope("ppo"):
            self._episodes = EpisodeMemory(template, num_agents, config.max_length, "episodes")
            self._memory = EpisodeMemory(
                template, config.update_every, config.max_length, "memory")
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
        self._random = tf.random.Generator.from_seed(config.seed)
        self._policy_optimizer = keras.optimizers.Adam(config.policy_lr)
        self._policy_optimizer.build(self._networks.policy.trainable_variables)
        self._value_optimizer = keras.optimizers.Adam(config.value_lr)
        self._value_optimizer.build(self._networks.value.trainable_variables)

    @property
    def checkpoint_state(self):
        """Trackables that define training, for `tf.train.Checkpoint(**checkpoint_state)`.

        Episodes in progress and the memory are left out: they are rebuilt by playing.
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
    def networks(self):
        return self._networks

    def begin_episodes(self, agent_indices):
        """Empties the current episode of the given agents (int32 `[n]`)."""
        return self._episodes.clear(agent_indices)

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
            normalized = self._observ_filter.transform(observ)
            params = self._networks.policy(normalized[:, None])
            params = {key: value[:, 0] for key, value in params.items()}
            distribution = self._distribution(params)
            action = tf.cond(
                tf.convert_to_tensor(self._is_training),
                lambda: distribution.sample(self._random),
                distribution.mode)
            if action.dtype.is_floating:
                action = tf.debugging.check_numerics(action, "non-finite action")
            rows = tf.cast(agent_indices, tf.int32)[:, None]
            stored = [self._last_params[key].scatter_nd_update(rows, params[key])
                      for key in self._param_shapes]
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
            with tf.control_dependencies([normalized, normalized_next]):
                statistics = [self._observ_filter.update(observ),
                              self._reward_filter.update(reward)]
            transition = {"observ": normalized, "action": action, "reward": reward}
            for key in self._param_shapes:
                transition["policy_" + key] = tf.gather(self._last_params[key], agent_indices)
            rows = agent_indices[:, None]
            terminated = tf.gather(self._batch_env.terminated, agent_indices)
            stored = [
                self._episodes.append(transition, agent_indices),
                self._episode_final.scatter_nd_update(rows, normalized_next),
                self._episode_terminated.scatter_nd_update(rows, terminated),
            ]
            return _after(statistics + stored, True)

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
        """One PPO update on the full memory; returns True once done."""
        config = self._config
        with tf.name_scope("update"):
            episodes, length = self._memory.data()
            mask = advantage_lib.sequence_mask(length, config.max_length)
            observ = episodes["observ"]
            action = episodes["action"]
            reward = self._reward_filter.transform(episodes["reward"]) * mask
            not_terminal = 1.0 - tf.cast(self._memory_terminated, tf.float32)
            value = self._networks.value(observ)
            bootstrap = self._networks.value(self._memory_final[:, None])[:, 0] * not_terminal
            advantage, target = advantage_lib.generalized_advantage(
                reward, value, bootstrap, length, config.discount, config.gae_lambda)
            mean = advantage_lib.masked_mean(advantage, mask)
            std = tf.sqrt(advantage_lib.masked_mean(tf.square(advantage - mean), mask))
            normalized_advantage = (advantage - mean) / (std + 1e-8) * mask
            old = self._distribution(
                {key: episodes["policy_" + key] for key in self._param_shapes})
            old_log_prob = old.log_prob(action)

            value_loss, value_norm = self._update_value(observ, target, mask)
            with tf.control_dependencies([value_loss]):
                policy_losses, policy_norm = self._update_policy(
                    observ, action, old, old_log_prob, normalized_advantage, mask)
            with tf.control_dependencies([policy_losses["loss"]]):
                new = self._distribution(self._networks.policy(observ))
                kl = advantage_lib.masked_mean(old.kl(new), mask)
                entropy = advantage_lib.masked_mean(new.entropy(), mask)
                penalty = self._penalty.assign(
                    losses.adapted_penalty(self._penalty, kl, config.kl_target))
            with tf.control_dependencies([penalty]):
                cleared = [self._memory.clear(), self._memory_index.assign(0)]

            with tf.summary.record_if(self._should_log), tf.name_scope("ppo/"):
                summaries = [
                    tf.summary.scalar("value_loss", value_loss),
                    tf.summary.scalar("value_gradient_norm", value_norm),
                    tf.summary.scalar("policy_loss", policy_losses["loss"]),
                    tf.summary.scalar("surrogate", policy_losses["surrogate"]),
                    tf.summary.scalar("policy_gradient_norm", policy_norm),
                    tf.summary.scalar("kl", kl),
                    tf.summary.scalar("kl_penalty", penalty),
                    tf.summary.scalar("kl_cutoff_count", policy_losses["cutoff_count"]),
                    tf.summary.scalar("entropy", entropy),
                    tf.summary.scalar(
                        "mean_return", advantage_lib.masked_mean(target, mask)),
                    tf.summary.histogram("advantage", tf.boolean_mask(advantage, mask > 0)),
                    tf.summary.histogram(
                        "action", tf.cast(tf.boolean_mask(action, mask > 0), tf.float32)),
                ]
                self._observ_filter.summary()
                self._reward_filter.summary()
            return _after(cleared + summaries, True)

    def _minimize(self, loss_fn, model, optimizer):
        """`update_epochs` Adam steps on `loss_fn()`; returns (last loss, mean gradient norm)."""
        variables = model.trainable_variables
        max_norm = self._config.max_gradient_norm

        def body(epoch, _, norm_sum):
            with tf.GradientTape() as tape:
                loss = loss_fn()
                total = loss["loss"] if isinstance(loss, dict) else loss
            gradients = tape.gradient(total, variables)
            norm = tf.linalg.global_norm(gradients)
            if max_norm:
                gradients, _ = tf.clip_by_global_norm(gradients, max_norm, use_norm=norm)
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            with tf.control_dependencies([optimizer.iterations]):
                return epoch + 1, loss, norm_sum + norm

        initial_loss = loss_fn()
        _, loss, norm_sum = tf.while_loop(
            lambda epoch, *_: epoch < self._config.update_epochs, body,
            (tf.constant(0), initial_loss, tf.constant(0.0)))
        return loss, norm_sum / float(self._config.update_epochs)

    def _update_value(self, observ, target, mask):
        with tf.name_scope("value"):
            return self._minimize(
                lambda: losses.value_loss(self._networks.value(observ), target, mask),
                self._networks.value, self._value_optimizer)

    def _update_policy(self, observ, action, old, old_log_prob, advantage, mask):
        config = self._config
        penalty = tf.identity(self._penalty)

        def loss_fn():
            new = self._distribution(self._networks.policy(observ))
            return losses.policy_loss(
                new.log_prob(action), old_log_prob, advantage, old.kl(new), mask, penalty,
                config.kl_target, config.kl_cutoff_factor, config.kl_cutoff_coef)

        with tf.name_scope("policy"):
            return self._minimize(loss_fn, self._networks.policy, self._policy_optimizer)

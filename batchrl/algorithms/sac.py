"""Soft actor-critic inside the TensorFlow graph.

Haarnoja, Zhou, Hartikainen, et al., "Soft Actor-Critic Algorithms and Applications",
arXiv:1812.05905 (2018): twin Q functions with Polyak-averaged targets, a tanh-squashed
Gaussian policy, and a temperature learned towards a target entropy.
"""

import math

import tensorflow as tf

from batchrl.algorithms import off_policy, parts
from batchrl.algorithms.actor import OffPolicyActor
from batchrl.algorithms.critic import TwinCritic
from batchrl.networks import q_networks
from batchrl.networks.constructors import Networks
from batchrl.tools.graph import after


class SACCritic(TwinCritic):
    """SAC's TD error: twin Q functions (`value_layers`; with declared layers, each its own
    torso) and their Polyak-averaged targets, and the temperature alpha (`log_temperature`,
    from `init_temperature`); y = R + gamma_k (min_j Q'_j(s', a') - alpha log pi(a'|s')),
    a' ~ pi(.|s') drawn with the acting half's generator (Haarnoja et al. 2018, eq. 5–6)."""

    def __init__(self, acting, config):
        super().__init__(acting, config)
        self.target_critic = self.make_target_critic()
        with tf.name_scope("sac"):
            self.log_alpha = tf.Variable(
                math.log(config.init_temperature), trainable=False, name="log_temperature")
        self.trackables = {"critic": self.critic, "target_critic": self.target_critic,
                           "log_temperature": self.log_alpha}

    def target(self, batch):
        alpha = tf.exp(self.log_alpha)
        next_action, next_log_prob = self.acting.sample(batch["nextob"], self.acting.generator)
        next_q = tf.reduce_min(self.target_critic(batch["nextob"], next_action), 0)
        return tf.stop_gradient(
            batch["reward"] + batch["discount"] * (next_q - alpha * next_log_prob))


class SACActor(OffPolicyActor):
    """SAC's acting half: a tanh-squashed Gaussian actor (`policy_layers`, or a torso of the
    config's declared layers); explored actions are sampled from it (no exploration on
    top by default), deterministic ones are tanh(mean)."""

    critic_class = SACCritic

    def make_policy(self):
        config = self._config
        torso = config.get("torso")  # Declared layers (`build` makes the factory).
        actor = q_networks.SquashedGaussianActor(
            int(math.prod(self.action_shape)), config.policy_layers, config.activation,
            hidden=torso(self.observation_space) if torso is not None else None)
        actor(tf.zeros((1,) + self.observ_shape))
        return actor

    def sample(self, observ, generator):
        """`(action, log_prob)` drawn with `generator` for normalized observations:
        float32 `[n, action_size]` and `[n]`."""
        mean, log_std = self.policy(observ)
        return q_networks.squashed_sample(mean, log_std, generator.normal(tf.shape(mean)))

    def greedy(self, observ):
        mean, _ = self.policy(observ)
        return tf.reshape(tf.tanh(mean), (-1,) + self.action_shape)

    def explore(self, observ):
        action, _ = self.sample(observ, self.generator)
        return tf.reshape(action, (-1,) + self.action_shape)

    def sampled(self, observ, generator):
        action, _ = self.sample(observ, generator)
        return tf.reshape(action, (-1,) + self.action_shape)


class SAC(off_policy.OffPolicyAlgorithm):
    """Soft actor-critic (Haarnoja et al. 2018, arXiv:1812.05905, algorithm 1).

    One update, on a sampled batch of transitions (s, a, R, gamma_k, s') with n-step
    return R and discount gamma_k (0 after a termination):

    - critic: both Q_i fit y = R + gamma_k (min_j Q'_j(s', a') - alpha log pi(a'|s')), a' ~
      pi(.|s'), with Q'_j the target networks (eq. 5–6, with the clipped double Q of
      Fujimoto et al. 2018); loss 0.5 sum_i mean(w (Q_i(s, a) - y)^2), w the importance
      weights of prioritized replay (1 otherwise);
    - actor: mean(alpha log pi(a~|s) - min_i Q_i(s, a~)), a~ ~ pi(.|s) reparameterized
      (eq. 7, 11);
    - temperature: log alpha descends -mean(log alpha (log pi(a~|s) + H_target)), H_target
      = `target_entropy` or -|A| (eq. 18, section 5);
    - targets: Q' <- tau Q + (1 - tau) Q', tau = `target_update_rate`, every
      `target_update_every` updates.

    The actor's loss is taken with the critics after this update's critic step, the
    temperature's with the actor's log pi(a~|s) before the actor's step. With prioritized
    replay, a transition's new priority comes from the mean over the two critics of
    |Q_i(s, a) - y| (Schaul et al. 2016 define it for one Q function, and neither SAC's
    nor TD3's paper uses prioritized replay: the mean is this code's choice, TD3's too).
    Diagnostics (TensorBoard, under `sac/`): `critic_loss`,
    `actor_loss`, `temperature_loss`, `temperature` alpha, `entropy` -mean log pi(a~|s),
    `q` mean min_i Q_i(s, a~), and the gradient norms.

    The policy acts with a sampled action while training (no further exploration by
    default) and with tanh(mean) otherwise (and in exported models; `sample` draws).

    Args:
      as for `OffPolicyAlgorithm`; config also `target_entropy` (None: -action size) and
      `init_temperature` (alpha at the start, > 0). `policy_lr` is the actor's and the
      temperature's learning rate, `value_lr` the critics'; `policy_layers` and
      `value_layers` the hidden sizes of the actor and of each Q function. With declared
      layers (config key `network`; `torso`, made by `batchrl.build`), the actor and each
      Q function (and their targets) get a torso of their own in place of the
      observation's MLP: the actor's replaces `policy_layers`; each Q function's output,
      joined with the action, goes through `value_layers` (may be empty).

    Raises:
      ValueError: if an action leaf is not a `Box` with finite bounds (naming it;
        `off_policy.check_box_actions`).
    """

    name = "sac"
    actor_class = SACActor
    config_keys = off_policy.OffPolicyAlgorithm.config_keys | {
        "target_entropy", "init_temperature", "network", "orthogonal_init"}

    def _build_networks(self, batch_env, config):
        if not config.init_temperature > 0:
            raise ValueError(f"config key 'init_temperature' must be > 0, got "
                             f"{config.init_temperature}")
        size = int(math.prod(self._action_shape))
        self._target_entropy = float(
            -size if config.target_entropy is None else config.target_entropy)
        actor = self._actor = self._acting.build_policy()
        critic = self._acting.build_critic()
        self._critic, self._target_critic = critic.critic, critic.target_critic
        self._log_alpha = critic.log_alpha
        self._actor_optimizer = self._adam(
            "policy_optimizer", config.policy_lr, actor.trainable_variables,
            config.max_gradient_norm)
        self._critic_optimizer = self._adam(
            "critic_optimizer", config.value_lr, self._critic.trainable_variables,
            config.max_gradient_norm)
        self._alpha_optimizer = self._adam("temperature_optimizer", config.policy_lr,
                                           [self._log_alpha])
        return Networks(policy=actor, critic=self._critic)

    def _update_step(self, batch):
        weight = batch["weight"]
        alpha = tf.exp(self._log_alpha)
        target = self._acting.critic.target(batch)
        critic_variables = self._critic.trainable_variables
        with tf.GradientTape() as tape:
            td_error = self._acting.critic.q_values(batch) - target
            critic_loss = 0.5 * tf.reduce_sum(
                tf.reduce_mean(weight * tf.square(td_error), -1))
        critic_norm = parts.apply_gradients(
            tape, critic_loss, critic_variables, self._critic_optimizer)
        actor_variables = self._actor.trainable_variables
        with tf.GradientTape() as tape:
            new_action, log_prob = self._acting.sample(batch["observ"], self._random)
            new_q = tf.reduce_min(self._critic(batch["observ"], new_action), 0)
            actor_loss = tf.reduce_mean(alpha * log_prob - new_q)
        with tf.control_dependencies([critic_norm]):
            actor_norm = parts.apply_gradients(
                tape, actor_loss, actor_variables, self._actor_optimizer)
        entropy_gap = tf.stop_gradient(log_prob + self._target_entropy)
        with tf.GradientTape() as tape:
            tape.watch(self._log_alpha)
            alpha_loss = -tf.reduce_mean(self._log_alpha * entropy_gap)
        alpha_gradient = tape.gradient(alpha_loss, self._log_alpha)
        stepped = self._alpha_optimizer.apply([alpha_gradient], [self._log_alpha])
        with tf.control_dependencies([actor_norm, stepped["gradient_norm"]]):
            targets = self._update_targets([(self._target_critic, self._critic)])
        diagnostics = {
            "critic_loss": critic_loss, "actor_loss": actor_loss,
            "temperature_loss": alpha_loss, "temperature": alpha,
            "entropy": -tf.reduce_mean(log_prob),
            "q": tf.reduce_mean(new_q), "critic_gradient_norm": critic_norm,
            "actor_gradient_norm": actor_norm}
        diagnostics = {key: after([targets], value)
                       for key, value in diagnostics.items()}
        return diagnostics, tf.reduce_mean(tf.abs(td_error), 0)


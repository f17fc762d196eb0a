"""Twin delayed deep deterministic policy gradient (TD3) inside the TensorFlow graph.

Fujimoto, van Hoof, Meger, "Addressing Function Approximation Error in Actor-Critic
Methods", arXiv:1802.09477 (2018).
"""

import math

import tensorflow as tf

from batchrl.algorithms import off_policy, parts
from batchrl.algorithms.actor import OffPolicyActor
from batchrl.algorithms.critic import TwinCritic
from batchrl.networks import q_networks
from batchrl.networks.constructors import Networks
from batchrl.tools.graph import after


class TD3Critic(TwinCritic):
    """TD3's TD error: twin Q functions (`value_layers`; with declared layers, each its own
    torso), the target policy (`target_policy`) and the critics' targets; y = R + gamma_k
    min_j Q'_j(s', a'), a' the target policy's action smoothed with clipped noise drawn
    with the acting half's generator (Fujimoto et al. 2018, eq. 14–15)."""

    def __init__(self, acting, config):
        super().__init__(acting, config)
        self.target_policy = off_policy.target_of(acting.policy, acting.make_policy,
                                                  self._inputs[0])
        self.target_critic = self.make_target_critic()
        self.trackables = {"critic": self.critic, "target_policy": self.target_policy,
                           "target_critic": self.target_critic}

    def target(self, batch):
        config = self._config
        next_action = self.target_policy(batch["nextob"])
        noise = tf.clip_by_value(
            config.target_noise * self.acting.generator.normal(tf.shape(next_action)),
            -config.target_noise_clip, config.target_noise_clip)
        next_action = tf.clip_by_value(next_action + noise, -1.0, 1.0)
        next_q = tf.reduce_min(self.target_critic(batch["nextob"], next_action), 0)
        return tf.stop_gradient(batch["reward"] + batch["discount"] * next_q)


class TD3Actor(OffPolicyActor):
    """TD3's acting half: a deterministic actor mu(s) = tanh(MLP(s)) (`policy_layers`, or a
    torso of the config's declared layers), perturbed while exploring by the config's
    `exploration` (default Gaussian noise of std 0.1)."""

    default_exploration = {"type": "gaussian", "std": 0.1}
    critic_class = TD3Critic

    def make_policy(self):
        config = self._config
        torso = config.get("torso")  # Declared layers (`build` makes the factory).
        return q_networks.DeterministicActor(
            int(math.prod(self.action_shape)), config.policy_layers, config.activation,
            hidden=torso(self.observation_space) if torso is not None else None)

    def greedy(self, observ):
        return tf.reshape(self.policy(observ), (-1,) + self.action_shape)

    def sampled(self, observ, generator):
        action = self.greedy(observ)
        std = self.exploration.spec.get("std", 0.0)
        return tf.clip_by_value(action + std * generator.normal(tf.shape(action)), -1.0, 1.0)


class TD3(off_policy.OffPolicyAlgorithm):
    """TD3 (Fujimoto et al. 2018, arXiv:1802.09477, algorithm 1).

    One update, on a sampled batch (s, a, R, gamma_k, s'):

    - critic: both Q_i fit y = R + gamma_k min_j Q'_j(s', a'), with the target policy
      smoothed: a' = clip(mu'(s') + clip(N(0, sigma~), -c, c), -1, 1), sigma~ =
      `target_noise`, c = `target_noise_clip` (section 5.3, eq. 14–15); loss sum_i mean(w
      (Q_i(s, a) - y)^2);
    - every `policy_delay` updates (section 5.2): the actor ascends Q_1(s, mu(s)), and the
      targets of actor and critics move by `target_update_rate` (Polyak). The targets move
      with the actor only, so `target_update_every` must stay 1: `policy_delay` sets how
      often they move.

    The actor steps on the critics after this update's critic step. With prioritized
    replay, a transition's new priority comes from the mean over the two critics of
    |Q_i(s, a) - y|, as SAC's. Diagnostics (TensorBoard, under `td3/`): `critic_loss`;
    `actor_loss`, -mean Q_1(s, mu(s)) of the last actor step; `q`, the critics' estimate
    mean Q_1(s, a) of the batch's transitions before the critic's step (as DQN's `q`);
    `critic_gradient_norm`.

    The actor is deterministic, mu(s) = tanh(MLP(s)); while training, the config's
    `exploration` (default `{type: gaussian, std: 0.1}`) perturbs its actions.

    Args:
      as for `OffPolicyAlgorithm`; config also `policy_delay`, `target_noise` and
      `target_noise_clip`. Declared layers (config key `network`) give the actor and each
      Q function a torso of their own, as for SAC.

    Raises:
      ValueError: if an action leaf is not a `Box` with finite bounds (naming it;
        `off_policy.check_box_actions`), `policy_delay` < 1, or `target_update_every`
        is not 1.
    """

    name = "td3"
    actor_class = TD3Actor
    config_keys = off_policy.OffPolicyAlgorithm.config_keys | {
        "policy_delay", "target_noise", "target_noise_clip", "network", "orthogonal_init"}

    def _build_networks(self, batch_env, config):
        if int(config.policy_delay) < 1:
            raise ValueError(f"config key 'policy_delay' must be at least 1, got "
                             f"{config.policy_delay}")
        if int(config.target_update_every) != 1:
            raise ValueError(f"config key 'target_update_every' must be 1 for td3, got "
                             f"{config.target_update_every}: its targets move with each actor "
                             f"step, every policy_delay updates")
        self._actor = self._acting.build_policy()
        critic = self._acting.build_critic()
        self._critic, self._target_critic = critic.critic, critic.target_critic
        self._target_actor = critic.target_policy
        with tf.name_scope(self.name):
            self._actor_loss = tf.Variable(0.0, trainable=False, name="last_actor_loss")
        self._actor_optimizer = self._adam(
            "policy_optimizer", config.policy_lr, self._actor.trainable_variables,
            config.max_gradient_norm)
        self._critic_optimizer = self._adam(
            "critic_optimizer", config.value_lr, self._critic.trainable_variables,
            config.max_gradient_norm)
        return Networks(policy=self._actor, critic=self._critic)

    def _update_step(self, batch):
        config = self._config
        target = self._acting.critic.target(batch)
        with tf.GradientTape() as tape:
            q = self._acting.critic.q_values(batch)
            td_error = q - target
            critic_loss = tf.reduce_sum(tf.reduce_mean(batch["weight"] * tf.square(td_error), -1))
        critic_norm = parts.apply_gradients(
            tape, critic_loss, self._critic.trainable_variables, self._critic_optimizer)

        def actor_step():
            with tf.GradientTape() as tape:
                q = self._critic(batch["observ"], self._actor(batch["observ"]))[0]
                loss = -tf.reduce_mean(q)
            norm = parts.apply_gradients(
                tape, loss, self._actor.trainable_variables, self._actor_optimizer)
            with tf.control_dependencies([norm]):
                moved = [op for target, online in (
                    (self._target_actor, self._actor), (self._target_critic, self._critic))
                    for op in off_policy.polyak(
                        target.variables, online.variables, config.target_update_rate)]
            return after(moved, self._actor_loss.assign(loss))

        with tf.control_dependencies([critic_norm]):
            due = tf.equal((self._updates + 1) % int(config.policy_delay), 0)
            actor_loss = tf.cond(due, actor_step, lambda: tf.identity(self._actor_loss))
        diagnostics = {"critic_loss": critic_loss, "actor_loss": actor_loss,
                       "q": tf.reduce_mean(q[0]), "critic_gradient_norm": critic_norm}
        return diagnostics, tf.reduce_mean(tf.abs(td_error), 0)

"""Deep Q-networks inside the TensorFlow graph, with double Q-learning and an optional
dueling head.

Mnih et al., "Human-level control through deep reinforcement learning", Nature 518 (2015);
van Hasselt, Guez, Silver, "Deep Reinforcement Learning with Double Q-learning", AAAI 2016;
Wang et al., "Dueling Network Architectures for Deep Reinforcement Learning", ICML 2016.
"""

import tensorflow as tf

from batchrl.algorithms import exploration as exploration_lib
from batchrl.algorithms import off_policy, parts
from batchrl.algorithms.actor import OffPolicyActor
from batchrl.algorithms.critic import Critic
from batchrl.networks import q_networks
from batchrl.networks.constructors import Networks
from batchrl.tools.graph import after


def double_q_target(reward, discount, next_online_q, next_target_q, double=True):
    """The bootstrapped target of DQN.

    y = R + gamma_k Q'(s', argmax_a Q(s', a)) with double Q-learning (van Hasselt et al.
    2016, eq. 4: the online network picks, the target network evaluates), else
    y = R + gamma_k max_a Q'(s', a) (Mnih et al. 2015, algorithm 1).

    Args:
      reward, discount: float32 `[batch]` (discount 0 after a termination).
      next_online_q, next_target_q: float32 `[batch, num_actions]`, Q(s', .) and Q'(s', .).
      double: bool.

    Returns:
      float32 `[batch]`.
    """
    if double:
        best = tf.argmax(next_online_q, -1, output_type=tf.int32)
        value = tf.gather(next_target_q, best, batch_dims=1)
    else:
        value = tf.reduce_max(next_target_q, -1)
    return reward + discount * value


class DQNCritic(Critic):
    """DQN's TD error: the online Q network (the acting half's policy) and its target
    network (`target_policy`), y = `double_q_target` (config `double_q`)."""

    def __init__(self, acting, config):
        super().__init__(acting, config)
        self.target_q = off_policy.target_of(acting.policy, acting.make_policy,
                                             tf.zeros((1,) + acting.observ_shape))
        self.trackables = {"target_policy": self.target_q}

    def q_values(self, batch):
        return tf.gather(self.acting.policy(batch["observ"]),
                         tf.cast(batch["action"], tf.int32), batch_dims=1)

    def target(self, batch, next_q=None):
        """`double_q_target` of a batch of normalized observations; `next_q`, the online
        Q(s', .) if computed before (None: computed here)."""
        nextob = batch["nextob"]
        if next_q is None:
            next_q = self.acting.masked_q(nextob)
        return tf.stop_gradient(double_q_target(
            batch["reward"], batch["discount"], next_q,
            self.acting.masked_q(nextob, self.target_q(nextob)),
            bool(self._config.double_q)))

    def td_error_from_values(self, batch, q_taken, next_q):
        """`td_error` from Q values computed before: `|Q(s, a) - y|` with `Q(s, a)` =
        `q_taken` and y = `double_q_target` of the online values `next_q` = Q(s', .) and
        the target network's on `nextob`, its one network pass. Horgan et al. 2018
        (arXiv:1803.00933), algorithm 1: an actor's transitions take their first priorities
        from the Q values it acted with.

        Args:
          batch: dict of `reward`, `discount` float32 `[n]` and raw `nextob` `[n, ...]`.
          q_taken: float32 `[n]`, Q(s, a) of the transitions' first steps.
          next_q: float32 `[n, num_actions]`, `DQNActor.values` of their `nextob`.

        Returns:
          float32 `[n]`.
        """
        batch = dict(batch, nextob=self.normalized(batch["nextob"]))
        return tf.abs(q_taken - self.target(batch, next_q))


class DQNActor(OffPolicyActor):
    """DQN's acting half: the Q network (`value_layers`, or a torso of the config's declared
    layers; a dueling head with `dueling`), greedy in Q (never choosing an action the
    observation's `action_mask` forbids), epsilon-greedy while exploring (`exploration`,
    default epsilon decaying from 1 to 0.05 over 10,000 steps).

    Raises:
      ValueError: the observation's `action_mask` has another size than the actions.
    """

    default_exploration = {"type": "epsilon_decay", "initial": 1.0, "final": 0.05,
                           "steps": 10000}
    discrete = True
    critic_class = DQNCritic

    def __init__(self, observation_space, action_space, config, *args, **kwargs):
        self.count = int(action_space.n)
        self._mask = getattr(observation_space, "action_mask", None)
        if self._mask is not None and self._mask[1] != self.count:
            raise ValueError(f"the observation's action_mask has {self._mask[1]} elements, "
                             f"the Discrete action space {self.count} actions")
        super().__init__(observation_space, action_space, config, *args, **kwargs)

    def make_policy(self):
        config = self._config
        torso = config.get("torso")  # Declared layers (`build` makes the factory).
        hidden = torso(self.observation_space) if torso is not None else None
        return q_networks.QNetwork(self.count, config.value_layers, config.activation,
                                   bool(config.dueling), hidden=hidden)

    def allowed(self, observ):
        """bool `[batch, num_actions]`, the actions the observations' `action_mask` allows
        (observations `[batch, n]`, flat); None without a mask."""
        if self._mask is None:
            return None
        offset, size = self._mask
        return observ[..., offset:offset + size] > 0.5

    def masked_q(self, observ, q=None):
        """Q(s, .) of the Q network (or the given `q` values), -1e9 for the actions the
        observation's mask forbids: never the greedy action, never a target's maximum."""
        q = self.policy(observ) if q is None else q
        allowed = self.allowed(observ)
        return q if allowed is None else tf.where(allowed, q, -1e9)

    def greedy(self, observ):
        return tf.argmax(self.masked_q(observ), -1, output_type=tf.int32)

    def act_with_values(self, observ, explore, agent_indices):
        """`act`'s action and the Q values it chose from: `(action, q)`, int32 `[n]` and
        float32 `[n, num_actions]`, Q(s, .) of the normalized observations with the mask's
        -1e9 (`masked_q`), from the one network pass that acting makes anyway. Arguments
        as `act`'s."""
        normalized = self.observ_filter.transform(observ)
        q = self.masked_q(normalized)
        greedy = tf.argmax(q, -1, output_type=tf.int32)
        return self.choose(normalized, explore, agent_indices, lambda: greedy,
                           lambda: greedy), q

    def values(self, observ):
        """Q(s, .) of the Q network for raw observations `[n, ...]`, as acting computes it
        (normalized, with the mask's -1e9): float32 `[n, num_actions]`."""
        return self.masked_q(self.observ_filter.transform(tf.cast(observ, tf.float32)))

    def exploration_kwargs(self, observ):
        return {"allowed": self.allowed(observ)}

    def sampled(self, observ, generator):
        return exploration_lib.epsilon_greedy(
            self.greedy(observ), self.exploration.spec.get("final", 0.0), generator,
            self.allowed(observ), self.count)


class DQN(off_policy.OffPolicyAlgorithm):
    """DQN (Mnih et al. 2015) with double Q-learning (`double_q`) and a dueling head
    (`dueling`).

    One update: Q(s, a) fits `double_q_target` with the Huber loss (delta 1, Mnih et al.
    2015, Methods: the clipped error term), weighted by the importance weights of
    prioritized replay; the target network moves by `target_update_rate` every
    `target_update_every` updates, by default (both None) copied every 10,000 updates
    (Mnih et al. 2015, Extended Data Table 1: the target network update frequency C,
    counted in parameter updates). Actions are
    epsilon-greedy while training (`exploration`, default `{type: epsilon_decay, initial:
    1.0, final: 0.05, steps: 10000}`), greedy otherwise and in exported models (`sample`:
    epsilon-greedy with the final epsilon; greedy with `apex_epsilon`, whose epsilons are
    each agent's own). Diagnostics (TensorBoard, under `dqn/`): `loss`, `q` (mean Q(s, a)
    of the batch), `gradient_norm`, and `epsilon`, the schedule's (0 unless
    `epsilon_decay`). With an observation's `action_mask` (a `Dict`
    observation's entry, 1 where an action may be taken), the forbidden actions are never
    greedy, never drawn at random, and never a target's maximum (their Q values count as
    -1e9).

    Args:
      as for `OffPolicyAlgorithm`; config also `double_q` and `dueling`. `value_lr` is the
      learning rate and `value_layers` the hidden sizes of the Q network; with declared
      layers (config key `network` a list, `batchrl.networks.spec`), `torso`, made by
      `batchrl.build` from them and `preprocessing`, `activation` and `orthogonal_init`,
      replaces those hidden layers: a function of the observation space returning a
      `batchrl.networks.torso.Torso`.

    Raises:
      ValueError: if the action space is not `Discrete`.
    """

    name = "dqn"
    actor_class = DQNActor
    discrete_actions = True
    default_batch_size = 64
    default_target_update_rate = 1.0  # A copy, as in Mnih et al. 2015.
    default_target_update_every = 10000
    config_keys = (off_policy.OffPolicyAlgorithm.config_keys - {"policy_lr"}) | {
        "double_q", "dueling", "network", "orthogonal_init"}

    def _build_networks(self, batch_env, config):
        self._q = self._acting.build_policy()
        self._target_q = self._acting.build_critic().target_q
        self._optimizer = self._adam("policy_optimizer", config.value_lr,
                                     self._q.trainable_variables, config.max_gradient_norm)
        return Networks(policy=self._q)

    def _update_step(self, batch):
        critic = self._acting.critic
        target = critic.target(batch)
        with tf.GradientTape() as tape:
            q = critic.q_values(batch)
            td_error = q - target
            error = tf.abs(td_error)
            huber = tf.where(error < 1.0, 0.5 * tf.square(td_error), error - 0.5)
            loss = tf.reduce_mean(batch["weight"] * huber)
        norm = parts.apply_gradients(
            tape, loss, self._q.trainable_variables, self._optimizer)
        with tf.control_dependencies([norm]):
            targets = self._update_targets([(self._target_q, self._q)])
        diagnostics = {"loss": loss, "q": tf.reduce_mean(q), "gradient_norm": norm,
                       "epsilon": self._epsilon()}
        return ({key: after([targets], value) for key, value in diagnostics.items()},
                error)

    def _epsilon(self):
        spec = self._exploration.spec
        if spec["type"] != "epsilon_decay":
            return tf.constant(0.0)
        return exploration_lib.epsilon(spec, self._step)

"""IMPALA: an actor-critic that learns from fixed-length rollouts of every agent with
V-trace, which corrects for a behaviour policy that lags behind the learner's.

Espeholt et al., "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", arXiv:1802.01561: the value regressed on the V-trace targets
v_s (eq. 1), the policy gradient rho_s * grad log pi(a_s|x_s) * (r_s + gamma * v_{s+1} -
V(x_s)) (section 4.2) and an entropy bonus, in one loss.
"""

import tensorflow as tf

from batchrl import optimizers
from batchrl.algorithms import parts
from batchrl.algorithms.advantage import masked, masked_mean
from batchrl.algorithms.on_policy import OnPolicyAlgorithm
from batchrl.algorithms.vtrace import vtrace
from batchrl.errors import ConfigError
from batchrl.optimizers import base as optimizer_base


def impala_loss(policy, value, batch, *, value_coef, entropy_coef):
    """The loss of Espeholt et al., section 4.2, as means over the valid steps (`mask`):
    `-E[A_s log pi(a_s|x_s)] + value_coef * E[(v_s - V(x_s))^2] / 2
    - entropy_coef * E[H(pi(x_s))]`, with the V-trace advantage `A_s` (`advantage`) and
    target `v_s` (`target`) of `batch` held constant. `policy` is the current policy's
    distribution and `value` float32 `[rows, time]` its value estimates on the batch.
    Returns `(loss, terms)`: the float32 scalar to minimize and a dict of its three terms
    (`policy_gradient_loss`, `value_loss`, `entropy`)."""
    mask = batch["mask"]
    policy_gradient_loss = -masked_mean(
        masked(batch["advantage"], mask) * policy.log_prob(batch["action"]), mask)
    value_loss = 0.5 * masked_mean(tf.square(masked(batch["target"], mask) - value), mask)
    entropy = masked_mean(policy.entropy(), mask)
    loss = policy_gradient_loss + value_coef * value_loss - entropy_coef * entropy
    return loss, {"policy_gradient_loss": policy_gradient_loss, "value_loss": value_loss,
                  "entropy": entropy}


def rho_diagnostics(log_ratio, mask, rho_bar):
    """What the importance weights rho = pi / mu (`exp(log_ratio)`, `[rows, time]`) of an
    update's valid steps (`mask`) say of the policy lag: `mean_rho`, their mean before
    truncation, and `rho_clipped`, the fraction of them above `rho_bar` (which V-trace
    truncates: their correction is cut; Espeholt et al. 2018, eq. 1). Float32 scalars."""
    rho = tf.exp(log_ratio)
    return {"mean_rho": masked_mean(rho, mask),
            "rho_clipped": masked_mean(tf.cast(rho > rho_bar, tf.float32), mask)}


class IMPALA(OnPolicyAlgorithm):
    """IMPALA's learner, fed here by the agents of this process (the synchronous mode).

    The memory holds the last `rollout_length` steps of every agent (rows that run across
    episode ends, as PPO's with `rollout_length`; each step keeps the parameters of the
    policy that acted); once full, one update: the V-trace targets and advantages
    (`batchrl.algorithms.vtrace`, with `discount`, the trace's `gae_lambda` and the
    truncation levels `rho_bar` and `c_bar`; `rho_bar` also bounds the policy gradient's
    weight) are computed with the value network and the policy as they are at the update's
    start, then one step of the optimizer (`optimizer`, null: Adam at `policy_lr`) on
    `impala_loss` over the variables of both networks (with `value_optimizer`, the value
    network's part of that gradient is stepped by its own optimizer at `value_lr`, each
    part clipped at `max_gradient_norm` on its own). Acted by the policy being updated,
    the rollouts give ratios pi / mu of 1, so that the targets are the n-step returns to
    the row's end (lambda-returns with `gae_lambda` below 1): synchronous A2C with those
    returns. A recurrent policy keeps each agent's state across rows (reset where an
    episode begins) and stores it with every step; the update unrolls each row from the
    state stored at its first step, zeroed where an episode begins inside the row, with
    gradients through time (`recurrent_replay: unroll`, `parts.unrolled_policy`), or
    replays each step alone from its stored state (`stepwise`, `parts.stepwise_policy`:
    no gradient through time); a feed-forward one is replayed
    row by row.

    Args:
      batch_env, step, is_training, should_log: as for `OnPolicyAlgorithm`.
      config: as for `OnPolicyAlgorithm` (`rollout_length` set), and also `policy_lr`,
        `optimizer`, `max_gradient_norm`, `gae_lambda`, `rho_bar`, `c_bar`, `value_coef`,
        `entropy_coef`, `lr_schedule` and `jit_update`.

    Raises:
      ValueError: `rollout_length` is null.
      ConfigError: `c_bar` above `rho_bar` (V-trace's analysis assumes rho_bar >= c_bar,
        Espeholt et al., section 4.1, below eq. 1).
    """

    name = "impala"
    stored_state_rollouts = True
    config_keys = OnPolicyAlgorithm.config_keys | {
        "rollout_length", "policy_lr", "optimizer", "max_gradient_norm", "gae_lambda",
        "rho_bar", "c_bar", "value_coef", "entropy_coef", "lr_schedule", "jit_update",
        "value_optimizer", "value_lr", "recurrent_replay"}

    @staticmethod
    def check_config(config):
        """Checks V-trace's truncation levels of `config` (before anything is built).

        Raises:
          ConfigError: `c_bar` above `rho_bar` (V-trace's analysis assumes rho_bar >=
            c_bar, Espeholt et al. 2018, section 4.1, below eq. 1).
        """
        if config.c_bar > config.rho_bar:
            raise ConfigError(f"config keys 'c_bar' ({config.c_bar}) and 'rho_bar' "
                              f"({config.rho_bar}): V-trace assumes rho_bar >= c_bar "
                              f"(Espeholt et al. 2018, section 4.1)")

    def __init__(self, batch_env, step, is_training, should_log, config):
        if not config.rollout_length:
            raise ValueError("impala learns from rollouts of every agent: set "
                             "rollout_length (e.g. 20)")
        self.check_config(config)
        super().__init__(batch_env, step, is_training, should_log, config)
        policy_optimizer = optimizers.create(
            config.get("optimizer") or {"type": "adam"}, config.policy_lr,
            config.max_gradient_norm, "optimizer")
        self._build_optimizers(
            policy_optimizer, self._separate_value_optimizer(config, policy_optimizer))

    def share_update(self, all_reduce):
        """Learns as one of several learners from now on: `all_reduce` (a
        `batchrl.distributed.collective.AllReduce`) averages each step's gradients over the
        learner processes before the optimizer clips and applies them, and adds every
        learner's fragment to the normalizers' statistics, so that learners that start from
        the same weights and learn from fragments of equal size step as one learner on
        their union. Call it before the first update (the update traces it in).

        Raises:
          ValueError: an optimizer that does not step on gradients (`natural_gradient`,
            `line_search`).
        """
        if not self._policy_optimizer.steps_on_gradients:
            raise ValueError(f"{self.name}: learners share gradients, and optimizer "
                             f"{self._config.get('optimizer')} does not step on them")
        self._all_reduce = all_reduce

    def update(self, batch):
        """One update on a batch of `_memory_batch`'s keys (rows of `rollout_length` steps).

        Returns:
          dict of float32 scalars for the summaries (the optimizer's `loss` and
          `gradient_norm`, the terms of `impala_loss`, `kl` from the behaviour policy to the
          updated one, `mean_return`: the mean V-trace target, `mean_rho`: the mean
          importance weight pi / mu before truncation, `rho_clipped`: the fraction of
          valid steps whose weight `rho_bar` truncated, and `_joint_step`'s gradient norms
          of each network), and `mask` and `advantage` (`[rows, time]`) for the
          histograms.
        """
        config, networks, distribution = self._config, self._networks, self._distribution
        mask, action = batch["mask"], batch["action"]
        # Rows from anywhere (a learner's batches need not have one row per agent here).
        batch = dict(batch, initial_state=tf.zeros([tf.shape(batch["reward"])[0], 0]))
        behaviour = parts.stored_policy(distribution, batch)
        log_ratio = self._replayed(batch).log_prob(action) - behaviour.log_prob(action)
        target, advantage = vtrace(
            log_ratio, batch["reward"], batch["value"], batch["next_value"],
            batch["terminated"], batch["done"], batch["length"], discount=config.discount,
            gae_lambda=config.gae_lambda, rho_bar=config.rho_bar, c_bar=config.c_bar,
            pg_rho_bar=config.rho_bar)
        batch.update(target=tf.stop_gradient(target), advantage=tf.stop_gradient(advantage))
        terms = {}

        def loss_fn():
            loss, parts_of_loss = impala_loss(
                self._replayed(batch),
                networks.value(batch["observ"]), batch, value_coef=config.value_coef,
                entropy_coef=config.entropy_coef)
            terms.update(parts_of_loss)
            return loss

        diagnostics = self._joint_step(loss_fn)
        with tf.control_dependencies(list(diagnostics.values())):
            new = self._replayed(batch)
        return {**diagnostics, **terms,
                "kl": masked_mean(behaviour.kl(new), mask),
                "mean_return": masked_mean(target, mask),
                **rho_diagnostics(log_ratio, mask, config.rho_bar),
                "mask": mask, "advantage": advantage}

    def _joint_step(self, loss_fn):
        """One step of the optimizer over the variables of both networks on `loss_fn()`
        (no arguments, float32 scalar); returns its diagnostics (e.g. `loss` and
        `gradient_norm`, the joint gradient's global norm before clipping). For a rule that
        steps on gradients (`steps_on_gradients`: Adam, SGD, RMSprop) also the global
        norms, before clipping, of the joint gradient's parts on the policy's own
        variables (`policy_gradient_norm`: the policy loss's gradient) and on the value
        network's own (`value_gradient_norm`: `value_coef` times the value loss's), from
        the same gradient (no further pass): where one is much larger, the clipping of the
        joint norm (`max_gradient_norm`) shortens the other's step with it. With a
        `value_optimizer` (`_separate_value_optimizer`), the policy's optimizer steps on the
        policy's part and the value network's on the value's, each clipped on its own."""
        variables = self._joint_variables()
        optimizer = self._policy_optimizer
        if not optimizer.steps_on_gradients:
            return optimizer.minimize(loss_fn, variables)[1]
        with tf.GradientTape() as tape:
            loss = loss_fn()
        gradients = optimizer_base.gradients(tape, loss, variables)
        if self._all_reduce is not None:  # Learners that share the update.
            gradients = self._all_reduce.mean(gradients)
        parts_of = {}  # Each network's own variables and their gradients.
        for name, network, other in (("policy", self._networks.policy, self._networks.value),
                                     ("value", self._networks.value, self._networks.policy)):
            shared = {id(variable) for variable in other.trainable_variables}
            own = {id(variable) for variable in network.trainable_variables} - shared
            parts_of[name] = [(gradient, variable) for gradient, variable
                              in zip(gradients, variables, strict=True) if id(variable) in own]
        if self._value_optimizer is None:
            norms = {name + "_gradient_norm": tf.linalg.global_norm([g for g, _ in pairs])
                     for name, pairs in parts_of.items()}
            return {"loss": loss, **optimizer.apply(gradients, variables), **norms}
        # Each network's part, clipped on its own (`value_optimizer`); the parts' norms are
        # those the two steps measured, and the joint norm theirs together (disjoint parts).
        norms = {}
        for name, step in (("policy", optimizer), ("value", self._value_optimizer)):
            pairs = parts_of[name]
            norms[name + "_gradient_norm"] = step.apply(
                [g for g, _ in pairs], [v for _, v in pairs])["gradient_norm"]
        joint = tf.sqrt(tf.add_n([tf.square(norm) for norm in norms.values()]))
        return {"loss": loss, "gradient_norm": joint, **norms}

    def _replayed(self, batch, distribution=None):
        """The current policy's distribution on the batch's rows (`initial_state` zeros);
        for a recurrent policy, each row unrolled from its first stored `state` with the
        state zeroed where an episode begins (`recurrent_replay: unroll`,
        `parts.unrolled_policy`: gradients through time), or each step from its stored
        `state` (`stepwise`, `parts.stepwise_policy`). `distribution` (None: the
        policy's) is what is built of the parameters' dict; `dict` returns the parameters
        themselves (float32 `[rows, time, ...]`)."""
        distribution = distribution or self._distribution
        if not self._recurrent:
            return parts.current_policy(self._networks, distribution, batch)
        if self._config.recurrent_replay == "unroll":
            return parts.unrolled_policy(self._networks, distribution, batch)
        return parts.stepwise_policy(self._networks, distribution, batch)

    def _scale_learning_rates(self, scale):
        """The optimizers' learning rates times `scale` (`lr_schedule`)."""
        return [assignment for optimizer in (self._policy_optimizer, self._value_optimizer)
                if optimizer is not None for assignment in optimizer.scale_learning_rate(scale)]

    def _separate_value_optimizer(self, config, policy_optimizer):
        """The value network's own optimizer (`value_optimizer` at `value_lr`, clipped at
        `max_gradient_norm` on its own) beside `policy_optimizer`, or None: one optimizer
        over both networks.

        Raises:
          ConfigError: `value_optimizer` with networks that share layers, or a rule of
            either optimizer that does not step on gradients (only Adam, SGD and RMSprop:
            the joint gradient is split between them).
        """
        spec = config.get("value_optimizer")
        if spec is None:
            return None
        if parts.shared_torso(self._networks) is not None:
            raise ConfigError(f"config key 'value_optimizer': {self.name}'s networks share "
                              f"their layers (share_layers): one optimizer steps both")
        value_optimizer = optimizers.create(spec, config.value_lr, config.max_gradient_norm,
                                            "value_optimizer")
        if not (value_optimizer.steps_on_gradients and policy_optimizer.steps_on_gradients):
            raise ConfigError(f"config key 'value_optimizer': with it, {self.name} steps "
                              f"each network on its part of one gradient, which adam, radam, "
                              f"sgd and rmsprop do (optimizer and value_optimizer)")
        return value_optimizer

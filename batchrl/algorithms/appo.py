"""APPO: PPO's objective on V-trace's advantages and targets, for fragments that an older
policy acted (IMPALA's learner with PPO's update).

PPO's clipped surrogate (Schulman et al., arXiv:1707.06347, eq. 7), or batchrl's KL
penalty with its cut-off (`batchrl.algorithms.ppo.losses.policy_loss`) on the KL from the
policy at the update's start (PPO's pi_old), with the importance ratio taken against the
behaviour policy that acted, on the advantages of V-trace
(Espeholt et al., arXiv:1802.01561, section 4.2, unweighted: the ratio weighs them) and
with the value regressed on V-trace's targets v_s (eq. 1): the combination of RLlib's and
Sample Factory's APPO.
"""

import contextlib

import tensorflow as tf

from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms import parts
from batchrl.algorithms.advantage import masked_mean
from batchrl.algorithms.impala import IMPALA, rho_diagnostics
from batchrl.algorithms.ppo import losses
from batchrl.algorithms.vtrace import vtrace


class APPO(IMPALA):
    """Asynchronous PPO: IMPALA's learner (rollouts of `rollout_length` steps of every
    agent, from this process's memory or from actors' fragments, `IMPALA.learn`) whose
    update takes `update_epochs` epochs of optimizer steps on PPO's loss instead of one step
    on IMPALA's.

    An update computes, with the policy and the value network as they are at its start,
    V-trace's targets v_s and advantages (`batchrl.algorithms.vtrace` with `discount`,
    `gae_lambda`, `rho_bar` and `c_bar`; the advantages without the weight rho'_s, as the
    surrogate's ratio weighs them), normalizes the advantages over the batch, then takes
    `update_epochs` epochs of steps of the optimizer (`optimizer`, null: Adam at
    `policy_lr`; with `value_optimizer`, the value network's at `value_lr`, as
    `IMPALA._joint_step` says) over the variables of both networks: each epoch shuffles the
    batch's rows (each an environment's `rollout_length` steps) and takes one step per
    minibatch of `batch_size` rows (null: one step on all; rows beyond a multiple of
    `batch_size` sit that epoch out), each on `policy loss + value_coef * value loss`: the
    policy loss is `batchrl.algorithms.ppo.losses.policy_loss` with the ratio pi / mu to the
    stored behaviour policy mu (the one that acted, up to `max_policy_lag` versions old),
    the clipped surrogate with `clip_ratio` (epsilon), else the surrogate with the KL
    penalty (`kl_init_penalty`) and the cut-off (`kl_cutoff_factor`, `kl_cutoff_coef`) on
    the KL from pi_old, the policy as it was at the update's start (its parameters computed
    once on the batch before the first step: APPO's "old policy", BatchPPO's `kl_reference:
    update_start`), to the current one; the entropy bonus `entropy_coef`; the value loss
    half the mean squared error to v_s. After the update, the penalty is adapted as PPO
    adapts it (`losses.adapted_penalty`: times 1.5 above 1.3 `kl_target`, divided by 1.5
    below 0.7 `kl_target`) on the mean KL(pi_old || pi) of the updated policy. The KL from
    mu would measure the policy lag besides the update (it grows with the lag whatever the
    update does, docs/algorithms.md has figures), so that the penalty would grow with
    `max_policy_lag`; the ratio pi / mu, which the surrogate and V-trace need, is the only
    place mu enters.

    With `update_epochs` 1 and no `batch_size`, a step on a batch that the updated policy
    acted itself (ratio 1; the clip is then not reached) has the gradient of IMPALA's
    policy-gradient term on normalized advantages (d r / d theta = d log pi / d theta at
    r = 1).

    A recurrent policy is replayed as by IMPALA (`recurrent_replay`).

    Args:
      batch_env, step, is_training, should_log: as for `IMPALA`.
      config: as for `IMPALA`, and also `update_epochs`, `batch_size`, `clip_ratio`,
        `kl_target`, `kl_init_penalty`, `kl_cutoff_factor` and `kl_cutoff_coef`.

    Raises:
      ValueError: as `IMPALA`; from `update`, `batch_size` above the batch's rows.
    """

    name = "appo"
    config_keys = IMPALA.config_keys | {
        "update_epochs", "batch_size", "clip_ratio", "kl_target", "kl_init_penalty",
        "kl_cutoff_factor", "kl_cutoff_coef"}

    def __init__(self, batch_env, step, is_training, should_log, config):
        super().__init__(batch_env, step, is_training, should_log, config)
        with tf.name_scope(self.name):
            self._penalty = tf.Variable(float(config.kl_init_penalty), dtype=tf.float32,
                                        trainable=False, name="kl_penalty")

    @property
    def checkpoint_state(self):
        """IMPALA's trackables and the KL penalty."""
        return dict(super().checkpoint_state, kl_penalty=self._penalty)

    def _reused(self):
        """The context in which the layers that the policy and the value network share
        (`share_layers`) run once for both on the same observations
        (`batchrl.networks.torso.Torso.reused`); none without shared layers."""
        torso = parts.shared_torso(self._networks)
        return contextlib.nullcontext() if torso is None else torso.reused()

    def update(self, batch):
        """One update (see the class docstring) on a batch of `_memory_batch`'s keys (rows
        of `rollout_length` steps), or of a fragment's (`IMPALA.learn`).

        Returns:
          dict of float32 scalars for the summaries (the optimizer's diagnostics of the
          last step, e.g. `loss` and `gradient_norm`; `surrogate`, `value_loss` and
          `entropy` of the last step; `kl`, the mean KL(pi_old || pi) from the policy at
          the update's start to the updated one (what the penalty adapts on);
          `behaviour_kl`, the mean KL(mu || pi) from the behaviour policy to the updated
          one (the lag and the update together);
          `mean_return`: the mean V-trace target; `mean_rho` and `rho_clipped`: the mean
          importance weight pi / mu at the update's start, before truncation, and the
          fraction of steps above `rho_bar` (`impala.rho_diagnostics`); the gradient norms
          of each network (`IMPALA._joint_step`); without `clip_ratio`,
          `kl_penalty`, adapted), and `mask` and `advantage` (`[rows, time]`, before the
          normalization) for the histograms.
        """
        config, distribution = self._config, self._distribution
        mask, action = batch["mask"], batch["action"]
        batch = dict(batch, initial_state=tf.zeros([tf.shape(batch["reward"])[0], 0]))
        behaviour = parts.stored_policy(distribution, batch)
        old_log_prob = behaviour.log_prob(action)
        # pi_old, the policy at the update's start: the reference of the KL penalty.
        start_params = self._replayed(batch, dict)
        start = distribution(start_params)
        log_ratio = start.log_prob(action) - old_log_prob
        target, advantage = vtrace(
            log_ratio, batch["reward"], batch["value"], batch["next_value"],
            batch["terminated"], batch["done"], batch["length"], discount=config.discount,
            gae_lambda=config.gae_lambda, rho_bar=config.rho_bar, c_bar=config.c_bar,
            pg_rho_bar=None)
        target, advantage = tf.stop_gradient(target), tf.stop_gradient(advantage)
        steps = {
            "observ": batch["observ"], "action": action, "mask": mask, "target": target,
            "advantage": advantage_lib.normalize(advantage, mask),
            "old_log_prob": old_log_prob,
            **{"old_policy_" + key: value for key, value in start_params.items()},
            # A recurrent policy's rows: their stored states and ends (`_replayed`).
            **{key: value for key, value in batch.items() if key == "state"},
            **({"done": batch["done"]} if self._recurrent else {})}
        rows = tf.shape(mask)[0]
        size = config.batch_size
        if size is None:
            per_epoch, size = 1, rows
        else:
            static_rows = mask.shape[0]
            if static_rows is not None and static_rows < size:
                raise ValueError(f"appo: batch_size {size} is more than the {static_rows} "
                                 f"rows of a batch (envs_per_actor, or num_agents in one "
                                 f"process)")
            per_epoch = rows // size

        def shuffle():
            order = tf.argsort(self._random.uniform([rows]))
            order.set_shape(mask.shape[:1])  # The same shape before and in the loop.
            return order

        def step(index, order):
            """The optimizer step `index` (from 0) on its minibatch of `order`'s rows;
            its diagnostics and loss terms."""
            picked = tf.gather(order, (index % per_epoch) * size + tf.range(size))
            minibatch = {key: tf.gather(value, picked) for key, value in steps.items()}
            minibatch["initial_state"] = tf.zeros([size, 0])
            return self._minibatch_step(minibatch)

        # The first step gives the structure of the diagnostics (they depend on the
        # optimizer); the others run in a loop, so that the graph holds two steps at most.
        order = shuffle()
        metrics = step(0, order)
        total = config.update_epochs * per_epoch

        def body(index, order, _):
            order = tf.cond(tf.equal(index % per_epoch, 0), shuffle, lambda: order)
            return index + 1, order, step(index, order)

        with tf.control_dependencies(tf.nest.flatten(metrics)):
            _, _, metrics = tf.while_loop(
                lambda index, *_: index < total, body, (tf.constant(1), order, metrics))
        with tf.control_dependencies(tf.nest.flatten(metrics)):
            new = self._replayed(batch)
        kl = masked_mean(start.kl(new), mask)
        result = {**metrics, "kl": kl, "behaviour_kl": masked_mean(behaviour.kl(new), mask),
                  "mean_return": masked_mean(target, mask),
                  **rho_diagnostics(log_ratio, mask, config.rho_bar),
                  "mask": mask, "advantage": advantage}
        if config.clip_ratio is None:
            result["kl_penalty"] = self._penalty.assign(
                losses.adapted_penalty(self._penalty, kl, config.kl_target))
        return result

    def _minibatch_step(self, minibatch):
        """One optimizer step over both networks on `minibatch` (rows of the update's
        batch, with its V-trace `target`, normalized `advantage`, the behaviour policy's
        `old_log_prob` and the `old_policy_` parameters of pi_old, the policy at the
        update's start); returns the optimizer's diagnostics and `surrogate`,
        `value_loss` and `entropy`, float32 scalars."""
        config, networks, distribution = self._config, self._networks, self._distribution
        mask, action = minibatch["mask"], minibatch["action"]
        reference = parts.stored_policy(distribution, minibatch, "old_policy_")
        terms = {}

        def loss_fn():
            with self._reused():  # Shared layers run once for both losses.
                new = self._replayed(minibatch)
                value = networks.value(minibatch["observ"])
            policy = losses.policy_loss(
                new.log_prob(action), minibatch["old_log_prob"], minibatch["advantage"],
                reference.kl(new), mask, self._penalty, config.kl_target,
                config.kl_cutoff_factor, config.kl_cutoff_coef, new.entropy(),
                config.entropy_coef, config.clip_ratio)
            value_loss = losses.value_loss(value, minibatch["target"], mask)
            terms.update(surrogate=policy["surrogate"], value_loss=value_loss,
                         entropy=masked_mean(new.entropy(), mask))
            return policy["loss"] + config.value_coef * value_loss

        return {**self._joint_step(loss_fn), **terms}

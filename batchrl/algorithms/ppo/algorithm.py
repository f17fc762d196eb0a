"""BatchPPO: proximal policy optimization inside the TensorFlow graph.

Hafner, Davidson, Vanhoucke, "TensorFlow Agents: Efficient Batched Reinforcement Learning
in TensorFlow", arXiv:1709.02878, section 4; Schulman et al., arXiv:1707.06347 (PPO with an
adaptive KL penalty); Heess et al., arXiv:1707.02286 (streaming normalization, KL cut-off).
"""

import tensorflow as tf

from batchrl import optimizers
from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms import parts
from batchrl.algorithms.on_policy import OnPolicyAlgorithm
from batchrl.algorithms.ppo import losses
from batchrl.tools.streaming import StreamingNormalize


class PPO(OnPolicyAlgorithm):
    """Proximal policy optimization with an adaptive KL penalty, as graph code.

    Episodes are collected, and observations and rewards normalized, as
    `OnPolicyAlgorithm` says; once the memory holds `update_every` episodes, PPO trains.
    The memory's episodes are cut into chunks of `chunk_length` consecutive steps (null:
    whole episodes); each of `update_epochs` epochs shuffles the chunks and takes one Adam
    step on the value loss and one on the policy's penalized surrogate loss per minibatch
    of `batch_size` chunks (null: all chunks, one full-batch step per epoch). Then the KL
    penalty is adapted from the KL between the reference policy and the new one, and the
    memory is emptied. A recurrent policy's chunk is replayed from the state stored at its
    first step. When the policy and the value network share their layers (`share_layers`),
    each minibatch takes one Adam step instead, on the policy loss plus `value_coef` times
    the value loss, with the layers run once for both (`_joint_step`).

    The policy loss may add an entropy bonus (`entropy_coef`); both learning rates may
    decay linearly to 0 over the run's `steps` (`lr_schedule`; they stay 0 past `steps`),
    and so may the KL target and with it the cut-off (`kl_schedule`), down to
    `kl_target_floor` (a tenth) of `kl_target`, where it stays, also past `steps` (a run
    resumed with more `steps` continues from the larger fraction, an Agent past `steps`
    keeps learning with the floor). Advantages are GAE(lambda),
    normalized over the memory; value targets are lambda-returns; the value after the last
    step of an episode is bootstrapped from its final observation when the episode was
    truncated and zero when it terminated. With `normalize_value`, the value network
    predicts the lambda-returns standardized by their running mean and standard deviation
    (updated with each update's targets before the value steps), and its output is mapped
    back to returns wherever values are used: the value-target normalization of PopArt
    (van Hasselt et al., arXiv:1602.07714; without its output-preserving rescaling of the
    last layer), which Yu et al., arXiv:2103.01955, recommend for PPO ("value
    normalization").

    With `clip_ratio` (epsilon), the policy loss is PPO's clipped surrogate instead
    (Schulman et al., arXiv:1707.06347, eq. 7), without the KL penalty and the cut-off; the
    KL is still measured for the summaries, and the penalty stays as it was.

    The importance ratio of the surrogate is always taken against the stored policy that
    acted (its parameters are stored with every step). The KL penalty, the cut-off and the
    penalty's adaptation measure the KL from the reference policy `kl_reference`:
    `behaviour`, that same stored policy (Hafner et al.), or `update_start`, the policy as
    it was when this update began, evaluated on the memory's observations (the paper's
    pi_old; a recurrent policy replayed, as in the policy steps, from the state stored at
    each chunk's first step, and so is the updated policy the KL is measured to). The two
    differ for episodes that began before the previous update.

    Args:
      batch_env, step, is_training, should_log: as for `OnPolicyAlgorithm`.
      config: as for `OnPolicyAlgorithm`, and also `update_epochs`, `policy_lr`,
        `value_lr`, `gae_lambda`, `kl_target`, `kl_cutoff_factor`, `kl_cutoff_coef`,
        `kl_init_penalty`, `max_gradient_norm` (None for no clipping), `batch_size`
        (None for full batches), `kl_reference` (`behaviour` or `update_start`),
        `jit_update` (compile the update with XLA), `entropy_coef`, `lr_schedule` and
        `kl_schedule` (`constant` or `linear`), `normalize_value`, `value_coef`,
        `clip_ratio` and `steps`.
    """

    name = "ppo"
    # The config keys PPO reads besides the run's and the network's (see
    # `OnPolicyAlgorithm.config_keys`).
    config_keys = OnPolicyAlgorithm.config_keys | {
        "update_epochs", "chunk_length", "batch_size", "policy_lr", "value_lr",
        "gae_lambda", "kl_target", "kl_cutoff_factor", "kl_cutoff_coef", "kl_init_penalty",
        "max_gradient_norm", "kl_reference", "jit_update", "entropy_coef", "lr_schedule",
        "kl_schedule", "normalize_value", "rollout_length", "value_coef", "clip_ratio"}
    histograms = ("advantage", "action")
    # The least fraction of `kl_target` that `kl_schedule: linear` decays to.
    kl_target_floor = 0.1

    def __init__(self, batch_env, step, is_training, should_log, config):
        super().__init__(batch_env, step, is_training, should_log, config)
        with tf.name_scope(self.name):
            self._penalty = tf.Variable(float(config.kl_init_penalty), dtype=tf.float32,
                                        trainable=False, name="kl_penalty")
            self._value_filter = StreamingNormalize((), name="value_normalize") if (
                config.normalize_value) else None
        self._shared_torso = parts.shared_torso(self._networks)
        self._value_coef = float(config.value_coef)  # The joint step's (shared torso).
        policy_optimizer = self._adam(config.policy_lr)
        if self._shared_torso is None:
            self._build_optimizers(policy_optimizer, self._adam(config.value_lr))
        else:
            self._build_optimizers(policy_optimizer, None)

    def _adam(self, learning_rate):
        """Adam at `learning_rate`, its gradients clipped to `max_gradient_norm` (None: not
        clipped): a `batchrl.optimizers` module, built by `_build_optimizers`."""
        return optimizers.create(
            {"type": "adam"}, learning_rate, self._config.max_gradient_norm)

    @property
    def checkpoint_state(self):
        """Trackables that define training (`OnPolicyAlgorithm.checkpoint_state`), with the
        optimizers, the KL penalty and, with `normalize_value`, the value targets'
        statistics (`value_filter`). The optimizers are their Keras optimizers
        (`KerasOptimizer.optimizer`), at the paths of checkpoints written before PPO's
        optimizers were `batchrl.optimizers` modules."""
        state = dict(super().checkpoint_state, kl_penalty=self._penalty)
        for name in ("policy_optimizer", "value_optimizer"):
            if name in state:
                state[name] = state[name].optimizer
        if self._value_filter is not None:
            state["value_filter"] = self._value_filter
        return state

    def update(self, batch):
        """One update (see the class docstring) on a batch of `_memory_batch`'s keys, from
        this process's memory or an actor's fragment (`learn`): `[rows, time, ...]`, their
        shapes static.

        Returns:
          dict of float32 scalars for the summaries (`kl`, `entropy`, `mean_return`, the
          losses and gradient norms of `_optimize`, and without `clip_ratio` `kl_penalty`
          and `kl_target`), and the batch's `mask`, `advantage` and `action`
          (`[rows, time, ...]`) for the histograms.
        """
        config = self._config
        observ, action, mask = batch["observ"], batch["action"], batch["mask"]
        advantage, target = parts.gae(
            batch, discount=config.discount, gae_lambda=config.gae_lambda)
        value_target = self._value_target(target, mask)
        behaviour_params = {key: batch["policy_" + key] for key in self._param_shapes}
        behaviour = self._distribution(behaviour_params)
        # Rows of this process's memory, or of an actor's fragment (`learn`); static.
        state = batch["state"] if self._recurrent else tf.zeros(mask.shape + (0,))
        if config.kl_reference == "update_start":
            # The paper's pi_old: the policy before this update, on the same observations
            # and from the same states as the policy steps.
            reference_params = self._replay_as_trained(observ, state)
        else:
            reference_params = behaviour_params
        steps = dict(
            observ=observ, action=action, state=state, mask=mask, target=value_target,
            advantage=advantage_lib.normalize(advantage, mask),
            old_log_prob=behaviour.log_prob(action),
            **{"reference_" + key: value for key, value in reference_params.items()})
        metrics = self._optimize(self._chunks(steps))

        with tf.control_dependencies(tf.nest.flatten(metrics)):
            if config.kl_reference == "update_start":
                new = self._distribution(self._replay_as_trained(observ, state))
            else:
                new = self._distribution(self._replay(observ))
            reference = self._distribution(reference_params)
            change = parts.policy_change(reference, new, mask)
            if config.clip_ratio is None:  # The clipped surrogate has no KL terms.
                change.update(kl_target=self._kl_target(), kl_penalty=self._penalty.assign(
                    losses.adapted_penalty(self._penalty, change["kl"], self._kl_target())))
        return dict(
            metrics, **change, mean_return=advantage_lib.masked_mean(target, mask),
            mask=mask, advantage=advantage, action=action)

    def _value(self, observ):
        """The value network's estimate of the return, `[batch, time]` float32; with
        `normalize_value`, its output mapped back from standardized returns."""
        value = super()._value(observ)
        if self._value_filter is None:
            return value
        return self._value_filter.inverse(value)

    def _value_target(self, target, mask):
        """What the value network fits: the lambda-returns `target` (`[episodes, time]`),
        or with `normalize_value` the same standardized by the running statistics after
        adding the valid steps (`mask`) of this update's."""
        if self._value_filter is None:
            return target
        updated = self._value_filter.update(tf.boolean_mask(target, mask > 0))
        with tf.control_dependencies([updated]):
            return advantage_lib.masked(self._value_filter.transform(target), mask)

    def _kl_target(self):
        """float32 scalar: `kl_target`; with `kl_schedule: linear`, times the fraction of
        the run still to train but at least `kl_target_floor`, reached at
        `1 - kl_target_floor` of `steps` and held from there on (also past `steps`).
        Schulman et al., arXiv:1707.06347, table 5 (Atari), anneal the clipping range with
        the learning rate; this anneals the KL target, which bounds an update's step as the
        clipping range does there. The floor keeps the target positive: against a target
        near 0 every KL is too large, so that the penalty would grow by 1.5 at every update
        up to its bound of 1e6 and the cut-off (`kl_cutoff_factor` times the target) would
        stop all learning."""
        target = tf.constant(self._config.kl_target, tf.float32)
        if self._config.kl_schedule == "linear":
            return target * tf.maximum(self._remaining(), self.kl_target_floor)
        return target

    def _scale_learning_rates(self, scale):
        """Sets the Adam learning rates (one with a shared torso) to their configured
        values times `scale` (`OnPolicyAlgorithm._schedule_learning_rates`); returns the
        assignments."""
        return [assignment for optimizer in (self._policy_optimizer, self._value_optimizer)
                if optimizer is not None for assignment in optimizer.scale_learning_rate(scale)]

    def _replay_as_trained(self, observ, state):
        """The current policy's parameters on the batch's rows as the policy steps see
        them: each chunk of `chunk_length` steps replayed from the recurrent state stored
        at its first step (`state`, `[rows, time, state_size]`); dict of `[rows, time,
        ...]`. For a feed-forward policy, and for
        whole episodes (their first stored state is zero), the same as `_replay`."""
        if not self._recurrent:
            return self._replay(observ)
        chunks = self._chunks({"observ": observ, "state": state})
        params, _ = self._networks.policy(chunks["observ"], chunks["state"][:, 0])
        episodes = tf.shape(observ)[:2]
        return {key: tf.reshape(value, tf.concat([episodes, tf.shape(value)[2:]], 0))
                for key, value in params.items()}

    def _chunks(self, steps):
        """Cuts `[rows, time, ...]` tensors (time a multiple of `chunk_length`) into
        `[chunks, chunk_length, ...]`."""
        chunk = self._chunk_length
        return {key: tf.reshape(value, tf.concat([[-1, chunk], tf.shape(value)[2:]], 0))
                for key, value in steps.items()}

    def _optimize(self, chunks):
        """`update_epochs` epochs of minibatch Adam steps on the value and the policy
        (`parts.minibatch_epochs`): each epoch visits the valid chunks (those with at least
        one valid step) in a new random order, in minibatches of `batch_size` chunks (all
        of them when None).

        Returns:
          dict of float32 scalars for the summaries: the losses of the last minibatch and
          the mean gradient norms.
        """
        config = self._config
        norms = (("gradient_norm",) if self._shared_torso is not None
                 else ("value_gradient_norm", "policy_gradient_norm"))

        def step(minibatch, in_range):
            minibatch["mask"] = minibatch["mask"] * in_range[:, None]
            return self._steps(minibatch)

        return parts.minibatch_epochs(
            chunks, tf.reduce_sum(chunks["mask"], 1) > 0, config.batch_size,
            config.update_epochs, self._random, step,
            ("value_loss", "policy_loss", "surrogate", "kl_cutoff_count"), norms)

    def _steps(self, minibatch):
        """The optimizer steps on one minibatch: a value step, then a policy step; with a
        shared torso (`share_layers`), one step on both losses (`_joint_step`).

        Returns:
          `(losses, norms)`: dicts of float32 scalars, `value_loss`, `policy_loss`,
          `surrogate` and `kl_cutoff_count`; `value_gradient_norm` and
          `policy_gradient_norm`, or the joint step's `gradient_norm`.
        """
        if self._shared_torso is not None:
            return self._joint_step(minibatch)
        with tf.name_scope("value"), tf.GradientTape() as tape:
            value_loss = self._value_loss(minibatch)
        value_norm = parts.apply_gradients(
            tape, value_loss, self._networks.value.trainable_variables, self._value_optimizer)
        with tf.control_dependencies([value_loss]), tf.name_scope("policy"):
            with tf.GradientTape() as tape:
                policy = self._policy_loss(minibatch)
            policy_norm = parts.apply_gradients(
                tape, policy["loss"], self._networks.policy.trainable_variables,
                self._policy_optimizer)
        return self._losses(value_loss, policy), {
            "value_gradient_norm": value_norm, "policy_gradient_norm": policy_norm}

    def _joint_step(self, minibatch):
        """One Adam step (the policy's optimizer) on `policy loss + value_coef * value
        loss` over the variables of both networks, whose shared torso runs once for both
        (`Torso.reused`), as PPO's Atari setting trains one network with both heads
        (Schulman et al., arXiv:1707.06347, eq. 9). Returns what `_steps` does."""
        with tf.name_scope("joint"), self._shared_torso.reused(), \
                tf.GradientTape() as tape:
            value_loss = self._value_loss(minibatch)
            policy = self._policy_loss(minibatch)
            loss = policy["loss"] + self._value_coef * value_loss
        norm = parts.apply_gradients(tape, loss, self._joint_variables(), self._policy_optimizer)
        return self._losses(value_loss, policy), {"gradient_norm": norm}

    @staticmethod
    def _losses(value_loss, policy):
        return {"value_loss": value_loss, "policy_loss": policy["loss"],
                "surrogate": policy["surrogate"], "kl_cutoff_count": policy["cutoff_count"]}

    def _value_loss(self, minibatch):
        return losses.value_loss(
            self._networks.value(minibatch["observ"]), minibatch["target"], minibatch["mask"])

    def _policy_loss(self, minibatch):
        """`losses.policy_loss` of the current policy on the minibatch (its dict)."""
        config = self._config
        reference = self._distribution(
            {key: minibatch["reference_" + key] for key in self._param_shapes})
        params, _ = self._networks.policy(minibatch["observ"], minibatch["state"][:, 0])
        new = self._distribution(params)
        return losses.policy_loss(
            new.log_prob(minibatch["action"]), minibatch["old_log_prob"],
            minibatch["advantage"], reference.kl(new), minibatch["mask"], self._penalty,
            self._kl_target(), config.kl_cutoff_factor, config.kl_cutoff_coef,
            new.entropy(), config.entropy_coef, config.clip_ratio)

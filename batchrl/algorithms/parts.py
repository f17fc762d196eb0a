"""Functions of batches that on-policy algorithms (those made with `build_algorithm`, and
PPO) share: the current and the stored policies, the KL from the update's start, GAE(lambda)
and its postprocessing, the diagnostics of a policy change and the value regression loss,
each a pure function of tensors (see `build_algorithm` for the batch's keys); and
`shared_torso`, the layers a policy and its value network share."""

import tensorflow as tf

from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms.advantage import masked, masked_mean, normalize


def current_policy(networks, distribution, batch):
    """The distribution of the policy as its variables are now, on the batch's episodes
    (replayed from `batch["initial_state"]`); its parameters are `[episodes, time, ...]`."""
    params, _ = networks.policy(batch["observ"], batch["initial_state"])
    return distribution(params)


def stepwise_policy(networks, distribution, batch):
    """The distribution of the policy as its variables are now, each step of the batch
    replayed alone from the recurrent state it was acted on (`batch["state"]` float32
    `[rows, time, state_size]`): rows may run across episode ends, where the state was
    reset. The stored state of R2D2 (Kapturowski et al., ICLR 2019, section 3) without a
    burn-in: no gradient flows from a step to the steps before it. Parameters
    `[rows, time, ...]`."""
    observ, state = batch["observ"], batch["state"]
    leading = tf.shape(state)[:2]
    params, _ = networks.policy(tf.reshape(observ, [-1, 1, *observ.shape[2:]]),
                                tf.reshape(state, [-1, state.shape[-1]]))

    def unflatten(value):  # [rows * time, 1, ...] -> [rows, time, ...]
        unflattened = tf.reshape(value, tf.concat([leading, tf.shape(value)[2:]], 0))
        unflattened.set_shape(state.shape[:2].concatenate(value.shape[2:]))
        return unflattened

    return distribution({key: unflatten(value) for key, value in params.items()})


def unrolled_policy(networks, distribution, batch):
    """The distribution of the policy as its variables are now, each row of the batch
    unrolled from the recurrent state stored at its first step (`batch["state"][:, 0]`),
    the state zeroed before each step that begins an episode (the step after a `done`):
    rows that run across episode ends are replayed as they were acted, and gradients flow
    through time inside each episode (`batchrl.networks.recurrence.unroll`; the mask of
    R2D2, Kapturowski et al., ICLR 2019, section 3, without a burn-in). Parameters
    `[rows, time, ...]`."""
    done = batch["done"]
    reset = tf.concat([tf.zeros_like(done[:, :1]), done[:, :-1]], 1)
    params, _ = networks.policy(batch["observ"], batch["state"][:, 0], reset=reset)
    return distribution(params)


def stored_policy(distribution, batch, prefix="policy_"):
    """The distribution of the parameters stored in the batch under `prefix`: `policy_`,
    the policy that acted; `old_policy_`, the policy when the update began."""
    return distribution({key[len(prefix):]: value for key, value in batch.items()
                         if key.startswith(prefix)})


def kl_from_update_start(networks, distribution, batch):
    """The mean KL divergence KL(pi_old || pi) over the batch's valid steps, from the
    policy when the update began (pi_old, held fixed) to the current one, in nats: the
    constraint of TRPO (Schulman et al., arXiv:1502.05477, eq. 12). Float32 scalar."""
    old = stored_policy(distribution, batch, "old_policy_")
    new = current_policy(networks, distribution, batch)
    return masked_mean(old.kl(new), batch["mask"])


def gae(batch, *, discount, gae_lambda):
    """`(advantage, returns)`: the GAE(lambda) advantages of the batch's episodes and the
    lambda-returns A_t + V(s_t) (Schulman et al., arXiv:1506.02438, eq. 16), both float32
    `[episodes, time]` and 0 beyond each episode's length; from the batch's `reward`,
    `value`, `bootstrap` and `length` (`advantage.generalized_advantage`), or for a memory
    of fixed-length rollouts (`rollout_length`), from its `reward`, `value`, `next_value`,
    `terminated`, `done` and `length` (`advantage.rollout_advantage`)."""
    if "next_value" in batch:
        return advantage_lib.rollout_advantage(
            batch["reward"], batch["value"], batch["next_value"], batch["terminated"],
            batch["done"], batch["length"], discount, gae_lambda)
    return advantage_lib.generalized_advantage(
        batch["reward"], batch["value"], batch["bootstrap"], batch["length"], discount,
        gae_lambda)


def gae_postprocess(batch, *, discount, gae_lambda):
    """Adds `advantage`, GAE(lambda) normalized to mean 0 and standard deviation 1 over the
    batch, and `return`, the lambda-returns A_t + V(s_t) as value targets (Schulman et
    al., arXiv:1506.02438, eq. 16); both float32 `[episodes, time]`."""
    advantage, returns = gae(batch, discount=discount, gae_lambda=gae_lambda)
    return {**batch, "advantage": normalize(advantage, batch["mask"]), "return": returns}


def policy_change(reference, new, mask):
    """The diagnostics of an update's policy change: `kl`, the mean KL(reference || new)
    over the valid steps (`mask` 1), in nats, and `entropy`, the mean entropy of `new`;
    dict of float32 scalars. `reference` and `new` are distributions over `[episodes,
    time]`."""
    return {"kl": masked_mean(reference.kl(new), mask),
            "entropy": masked_mean(new.entropy(), mask)}


def value_loss(networks, distribution, batch):
    """Half the mean squared error of V(s_t) against `batch["return"]` over the valid steps;
    float32 scalar. The returns are masked before the difference, so that a NaN or
    infinite return at a padded step adds nothing and passes no NaN gradient."""
    del distribution
    target = masked(batch["return"], batch["mask"])
    return 0.5 * masked_mean(tf.square(networks.value(batch["observ"]) - target),
                             batch["mask"])


def apply_gradients(tape, loss, variables, optimizer):
    """One step of `optimizer` (a `batchrl.optimizers` module with `apply`, e.g. a Keras
    Adam's, which clips to its global norm first) on the gradient of `loss` (recorded on
    `tape`) for `variables`; returns the gradient's global norm before clipping (float32
    scalar), ready once the step is taken. PPO's, SAC's, TD3's and DQN's steps."""
    return optimizer.apply(tape.gradient(loss, variables), variables)["gradient_norm"]


def shared_torso(networks):
    """The hidden layers that the policy and the value network of `networks` share (a
    `batchrl.networks.torso.Torso` of declared layers with `share_layers`; it has `reused()`), or
    None: the layer each network holds as `_hidden`, when it is the same one."""
    torso = getattr(networks.value, "_hidden", None)
    if torso is None or not hasattr(torso, "reused"):
        return None
    return torso if getattr(networks.policy, "_hidden", None) is torso else None


def minibatch_epochs(data, valid, batch_size, epochs, random, step, last, summed):
    """`epochs` passes over the valid rows of `data`, each in a new random order, in
    minibatches of `batch_size` rows (None: all); the last minibatch of a pass may hold
    fewer. Shapes stay static (a minibatch is padded with rows marked out of range), so
    that XLA can compile the loop. PPO's and PQN's epochs.

    Args:
      data: dict of tensors `[capacity, ...]`, `capacity` static.
      valid: bool `[capacity]`, the rows to visit.
      batch_size: int or None.
      epochs: int >= 0.
      random: the `tf.random.Generator` of the orders.
      step: `step(minibatch, in_range) -> (last, summed)`: one optimizer step on
        `minibatch` (`data`'s keys, `[batch, ...]`) whose rows count where `in_range`
        (float32 `[batch]`) is 1; returns two dicts of float32 scalars.
      last, summed: the names of `step`'s two dicts (tuples of str).

    Returns:
      dict of float32 scalars: `last`'s values of the final step (0 without steps) and
      `summed`'s means over the steps.
    """
    capacity = valid.shape[0]
    batch = min(batch_size or capacity, capacity)
    count = tf.reduce_sum(tf.cast(valid, tf.int32))
    batches = (count + batch - 1) // batch
    total = epochs * batches
    slots = tf.range(batch)
    metrics = {name: tf.constant(0.0) for name in tuple(last) + tuple(summed)}

    def shuffle():
        # Valid rows first, in random order; `batch` spare entries so that the last
        # minibatch's slice stays inside.
        keys = tf.where(valid, random.uniform([capacity]), 2.0)
        return tf.concat([tf.argsort(keys), tf.zeros([batch], tf.int32)], 0)

    def body(index, order, metrics):
        position = index % batches
        order = tf.cond(tf.equal(position, 0), shuffle, lambda: order)
        start = position * batch
        rows = tf.gather(order, start + slots)
        minibatch = {key: tf.gather(value, rows) for key, value in data.items()}
        final, sums = step(minibatch, tf.cast(start + slots < count, tf.float32))
        return index + 1, order, dict(
            final, **{name: metrics[name] + sums[name] for name in summed})

    _, _, metrics = tf.while_loop(
        lambda index, *_: index < total, body,
        (tf.constant(0), tf.zeros([capacity + batch], tf.int32), metrics))
    steps = tf.cast(tf.maximum(total, 1), tf.float32)
    return {name: value / steps if name in summed else value
            for name, value in metrics.items()}

"""Algorithms from a few pure functions: a loss over a batch of episodes, a postprocessing
of the batch, a value loss and declared optimizers (`build_algorithm`)."""

import functools
import inspect
import re

import tensorflow as tf

from batchrl import optimizers
from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms import parts
from batchrl.algorithms.on_policy import OnPolicyAlgorithm
from batchrl.optimizers import spec as spec_lib

_ROLES = ("loss_fn", "postprocess_fn", "value_loss_fn", "kl_fn")


class FunctionalAlgorithm(OnPolicyAlgorithm):
    """The algorithm class that `build_algorithm` derives from; see there."""

    name = "functional"
    functions = {}  # role -> function, set by build_algorithm.
    # What every algorithm of build_algorithm reads (OnPolicyAlgorithm.config_keys);
    # build_algorithm adds its functions' keywords and drops the value network's keys
    # when there is no value loss.
    config_keys = OnPolicyAlgorithm.config_keys | {
        "policy_lr", "value_lr", "optimizer", "value_optimizer", "max_gradient_norm",
        "jit_update", "lr_schedule", "rollout_length"}
    default_optimizer = {"type": "adam"}
    default_value_optimizer = {"type": "adam"}

    def __init__(self, batch_env, step, is_training, should_log, config):
        super().__init__(batch_env, step, is_training, should_log, config)
        self._functions = {role: _bind(self.name, role, function, config)
                           for role, function in self.functions.items() if function}
        self._build_optimizers(
            optimizers.create(config.get("optimizer") or self.default_optimizer,
                              config.policy_lr, config.max_gradient_norm, "optimizer"),
            optimizers.create(config.get("value_optimizer") or self.default_value_optimizer,
                              config.value_lr, config.max_gradient_norm, "value_optimizer"))

    @classmethod
    def required_config_keys(cls):
        """`{(role, key)}`: the keyword-only parameters without defaults of the functions,
        which the config's keys of the same names fill in."""
        return {(role, parameter.name)
                for role, function in cls.functions.items() if function
                for parameter in inspect.signature(function).parameters.values()
                if parameter.kind is parameter.KEYWORD_ONLY
                and parameter.default is parameter.empty}

    def update(self, batch):
        """One update on a batch of `_memory_batch`'s keys (those `build_algorithm`
        documents but `old_policy_<param>`, added here): postprocesses it, takes the policy
        optimizer's step and then the value optimizer's; returns the diagnostics
        (`policy/...`, `value/...`, `kl`, `entropy`, `mean_return`), `mask` and, when
        postprocessing adds it, `advantage`."""
        batch = dict(batch)
        for key, value in self._replay(batch["observ"]).items():
            batch["old_policy_" + key] = value
        if "postprocess_fn" in self._functions:
            batch = self._functions["postprocess_fn"](batch)
        batch = {key: tf.stop_gradient(value) for key, value in batch.items()}
        networks, distribution = self._networks, self._distribution
        functions = self._functions
        kl_fn = functions.get("kl_fn", parts.kl_from_update_start)
        _, policy = self._policy_optimizer.minimize(
            lambda: functions["loss_fn"](networks, distribution, batch),
            networks.policy.trainable_variables,
            lambda: kl_fn(networks, distribution, batch))
        metrics = {"policy/" + key: value for key, value in policy.items()}
        if "value_loss_fn" in functions:
            with tf.control_dependencies(list(policy.values())):
                _, value = self._value_optimizer.minimize(
                    lambda: functions["value_loss_fn"](networks, distribution, batch),
                    networks.value.trainable_variables)
            metrics.update({"value/" + key: item for key, item in value.items()})
        with tf.control_dependencies(list(metrics.values())):
            new = parts.current_policy(networks, distribution, batch)
            old = parts.stored_policy(distribution, batch, "old_policy_")
            metrics.update(parts.policy_change(old, new, batch["mask"]))
        if "return" in batch:
            metrics["mean_return"] = advantage_lib.masked_mean(batch["return"], batch["mask"])
        metrics["mask"] = batch["mask"]
        if "advantage" in batch:
            metrics["advantage"] = batch["advantage"]
        return metrics

    def _memory_batch(self):
        """The memory as the batch that `build_algorithm` documents, but
        `old_policy_<param>` (`update` adds it): that of
        `OnPolicyAlgorithm._memory_batch` with `done`, `terminated` and `initial_state`
        (and without a recurrent policy's `state`)."""
        batch = super()._memory_batch()
        if self._rollout_length:  # `_rollout_batch` has made it.
            return batch
        batch.pop("state", None)  # Episodes are replayed from their start.
        length = batch["length"]
        last = tf.equal(tf.range(self._memory_length)[None, :], length[:, None] - 1)
        batch.update(
            done=last, terminated=tf.logical_and(last, self._memory_terminated[:, None]),
            initial_state=tf.zeros([self._config.update_every, self._state_size]))
        return batch

    def _rollout_batch(self, rows, observ, next_observ, length):
        """The batch of rows of `rollout_length` steps (this process's memory, or an
        actor's fragment: `learn`), with `initial_state` (zeros: a feed-forward policy's
        rows are replayed as they are; `OnPolicyAlgorithm` refuses a recurrent one with
        `rollout_length`)."""
        batch = super()._rollout_batch(rows, observ, next_observ, length)
        batch["initial_state"] = tf.zeros([tf.shape(observ)[0], self._state_size])
        return batch


def _bind(name, role, function, config):
    """`function` with its keyword-only parameters set to the config's keys of the same
    names (those with defaults keep them when the config has no such key).

    Raises:
      ValueError: a keyword-only parameter without a default is not a config key.
    """
    keywords = {}
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is not parameter.KEYWORD_ONLY:
            continue
        if parameter.name in config:
            keywords[parameter.name] = config[parameter.name]
        elif parameter.default is parameter.empty:
            raise ValueError(f"{role} of algorithm {name!r} takes the keyword "
                             f"{parameter.name!r}, which is not a config key")
    return functools.partial(function, **keywords) if keywords else function


def _config_keys(functions):
    """The config keys an algorithm of `build_algorithm` with these functions (role ->
    function or None) reads; frozenset of str."""
    keys = set(FunctionalAlgorithm.config_keys)
    if functions["value_loss_fn"] is None:
        keys -= {"value_lr", "value_optimizer"}
    for function in filter(None, functions.values()):
        keys.update(parameter.name for parameter in inspect.signature(function).parameters
                    .values() if parameter.kind is parameter.KEYWORD_ONLY)
    return frozenset(keys)


def build_algorithm(name, loss_fn, postprocess_fn=None, value_loss_fn=None, optimizer=None,
                    value_optimizer=None, kl_fn=None):
    """An algorithm class made of pure functions, on batchrl's episode collection.

    The class is constructed as `Algorithm(batch_env, step, is_training, should_log,
    config)` and has `begin_episodes / perform / experience / end_episodes`, as `simulate`
    calls them; acting, normalizing and collecting whole episodes are those of
    `OnPolicyAlgorithm` (its config keys apply). Once the memory holds `update_every`
    episodes, one update: the batch is built, `postprocess_fn` adds to it, the policy
    optimizer minimizes `loss_fn` over the policy's variables (with `kl_fn` for optimizers
    that need it), then the value optimizer minimizes `value_loss_fn` over the value
    network's, and the memory is emptied. Summaries under `NAME/`: the optimizers'
    diagnostics (`policy/...`, `value/...`), `kl` (from the policy when the update began to
    the new one), `entropy`, `mean_return` (when the batch has a `return`) and a histogram
    of `advantage` (when it has one).

    The batch is a dict of tensors over `E = update_every` episodes padded to `T` steps
    (the episode length limit): `observ` float32 `[E, T, *observation_shape]`
    (normalized); `action` `[E, T, *action_shape]`; `reward` float32 `[E, T]` (scaled by
    the reward normalizer); `done` bool `[E, T]`, true at each episode's last step;
    `terminated` bool `[E, T]`, true at the last step of an episode that reached a terminal
    state; `mask` float32 `[E, T]`, 1 for valid steps; `length` int32 `[E]`; `value`
    float32 `[E, T]`, V(s_t) before this update; `bootstrap` float32 `[E]`, the value of
    the observation after the last step (0 when terminated); `initial_state` float32
    `[E, state_size]`, zeros (episodes are replayed from their start); `policy_<param>`,
    the parameters of the policy that acted at each step; `old_policy_<param>`, those of
    the policy when this update began. Entries are zero beyond each episode's length
    unless masked otherwise. Gradients do not flow into the batch.

    With `rollout_length` (a feed-forward policy), the memory holds the last
    `rollout_length` steps of every agent instead, rows that run across episode ends: `E`
    is the number of agents and `T` is `rollout_length`; `next_value` float32 `[E, T]`
    (V(s_{t+1}): of the final observation where an episode ended) replaces `bootstrap`,
    and `done` and `terminated` mark the ends inside the rows (`parts.gae` reads either
    form). Such an algorithm also learns from Ray actors' fragments (config key `actors`;
    `OnPolicyAlgorithm.learn`) with no code of its own.

    Args:
      name: the algorithm's name (letters, digits, `_`, `-`, `.`): the class name and the
        summaries' scope.
      loss_fn: `loss_fn(networks, distribution, batch) -> float32 scalar`, the policy's
        loss, to be minimized; `networks` is the `batchrl.networks.Networks` (`policy`,
        `value`, `distribution`), `distribution` the distribution class
        (`batchrl.algorithms.parts` has helpers).
      postprocess_fn: `postprocess_fn(batch) -> batch`, e.g. adding `advantage` and
        `return`; None keeps the batch.
      value_loss_fn: `value_loss_fn(networks, distribution, batch) -> float32 scalar`;
        None: the value network is not trained.
      optimizer: the policy optimizer's declaration (see `batchrl.optimizers.spec`) when
        the config's `optimizer` is null; None: Adam at the config's `policy_lr`.
      value_optimizer: the same for the value network (config key `value_optimizer`);
        None: Adam at `value_lr`.
      kl_fn: `kl_fn(networks, distribution, batch) -> float32 scalar`, the KL divergence
        that optimizers bound; None: `parts.kl_from_update_start`.

    Keyword-only parameters of the functions (after `*`) are filled in from the config's
    keys of the same names, e.g. `def postprocess(batch, *, discount, gae_lambda)`.

    Returns:
      A subclass of `FunctionalAlgorithm` named `name`. Its `config_keys` (see
      `OnPolicyAlgorithm`) are `FunctionalAlgorithm.config_keys` with the functions'
      keyword-only parameters, without `value_lr` and `value_optimizer` when
      `value_loss_fn` is None.

    Raises:
      ValueError: a bad name, a function that is not callable, or a bad optimizer
        declaration.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", name):
        raise ValueError(f"algorithm name {name!r} must be letters, digits, _, - or . "
                         f"starting with a letter")
    functions = dict(zip(_ROLES, (loss_fn, postprocess_fn, value_loss_fn, kl_fn),
                         strict=True))
    for role, function in functions.items():
        if function is not None and not callable(function) or role == "loss_fn" and (
                function is None):
            raise ValueError(f"{role} of algorithm {name!r} must be a function, got "
                             f"{function!r}")
    attributes = {"name": name, "functions": functions, "__module__": getattr(
        loss_fn, "__module__", __name__), "__doc__": (
        f"The algorithm {name!r} of `build_algorithm`: loss "
        f"{getattr(loss_fn, '__qualname__', loss_fn)}."),
        "config_keys": _config_keys(functions)}
    if optimizer is not None:
        attributes["default_optimizer"] = spec_lib.check(optimizer, "optimizer")
    if value_optimizer is not None:
        attributes["default_value_optimizer"] = spec_lib.check(
            value_optimizer, "value_optimizer")
    return type(name, (FunctionalAlgorithm,), attributes)

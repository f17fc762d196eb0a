"""NumPy references for the update tests of SAC, TD3 and DQN: forward passes of the
networks of `batchrl.networks.q_networks` from weights read out of the models (float64,
ReLU hidden layers, the config's default activation), and helpers to build the tests'
algorithms and batches."""

import keras
import numpy as np
import tensorflow as tf

from batchrl import configs
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment

SMALL = {"policy_layers": [8], "value_layers": [8, 8], "learning_starts": 1,
         "replay_capacity": 64, "normalize_observ": False}


def config(algorithm, **overrides):
    return configs.load("default", {"algorithm": algorithm, **SMALL, **overrides})


def mock_env(observ_size=3, action_size=2, count=2, num_actions=None, truncate=()):
    """An in-graph batch of MockEnvironments with `Box(-1, 1, (action_size,))` actions, or
    `Discrete(num_actions)` ones; those of the indices `truncate` end their episodes by
    truncation, the others by termination."""
    shape = (action_size,) if num_actions is None else ()
    envs = [MockEnvironment((observ_size,), shape, 2, 7, truncate=index in truncate,
                            num_actions=num_actions)
            for index in range(count)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    return InGraphBatchEnv(BatchEnv(envs, blocking=True))


def build(cls, batch_env, step=0, **overrides):
    """`cls` on `batch_env` with the `SMALL` config and `overrides`, training, not logging;
    its initial weights seeded (the tests' batches are made for them)."""
    keras.utils.set_random_seed(0)
    return cls(batch_env, tf.Variable(step, dtype=tf.int64), tf.Variable(True),
               tf.Variable(False), config(cls.name, **overrides))


def perturb(model, scale, seed):
    """Adds normal noise of std `scale` to every weight of `model` (a target network made
    to differ from its online network)."""
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        variable.assign(variable.numpy() + scale * rng.normal(size=variable.shape))


def clone(generator):
    """A `tf.random.Generator` in the state of `generator`: it draws the same numbers."""
    return tf.random.Generator.from_state(generator.state.numpy(), generator.algorithm)


def relu(x):
    return np.maximum(x, 0.0)


def _dense(layer):
    return layer.kernel.numpy().astype(np.float64), layer.bias.numpy().astype(np.float64)


def _mlp_weights(mlp):
    """[(kernel, bias)] of a `batchrl.networks.mlp.MLP`."""
    return [_dense(layer) for layer in mlp._dense]


def _mlp(layers, observ):
    hidden = np.asarray(observ, np.float64).reshape(len(observ), -1)
    for kernel, bias in layers:
        hidden = relu(hidden @ kernel + bias)
    return hidden


def twin_q_weights(model):
    """The weights of a `TwinQ`: [(kernel [heads, in, out], bias [heads, 1, out])]."""
    layers = [getattr(model, f"_hidden{index}") for index in range(model._depth)]
    return [(layer.kernel.numpy().astype(np.float64), layer.bias.numpy().astype(np.float64))
            for layer in layers + [model._output]]


def twin_q(weights, observ, action):
    """Q_i(s, a) of each head, `[heads, batch]`."""
    hidden = np.concatenate([np.asarray(observ, np.float64), action], -1)[None]
    for index, (kernel, bias) in enumerate(weights):
        hidden = hidden @ kernel + bias
        if index < len(weights) - 1:
            hidden = relu(hidden)
    return hidden[..., 0]


def gaussian_actor_weights(model):
    """The weights of a `SquashedGaussianActor`."""
    return {"hidden": _mlp_weights(model._hidden), "mean": _dense(model._mean),
            "log_std": _dense(model._log_std)}


def squashed_sample(weights, observ, noise):
    """SAC's reparameterized action and its log-density (Haarnoja et al. 2018,
    arXiv:1812.05905, appendix C): u = mean + std noise, a = tanh(u), log pi(a|s) =
    sum(log N(u; mean, std) - log(1 - tanh(u)^2)). Returns `(a, log_pi)`."""
    hidden = _mlp(weights["hidden"], observ)
    mean = hidden @ weights["mean"][0] + weights["mean"][1]
    log_std = np.clip(hidden @ weights["log_std"][0] + weights["log_std"][1], -20.0, 2.0)
    u = mean + np.exp(log_std) * noise
    log_normal = -0.5 * noise ** 2 - log_std - 0.5 * np.log(2.0 * np.pi)
    return np.tanh(u), (log_normal - np.log(1.0 - np.tanh(u) ** 2)).sum(-1)


def deterministic_actor_weights(model):
    """The weights of a `DeterministicActor`."""
    return {"hidden": _mlp_weights(model._hidden), "output": _dense(model._output)}


def deterministic_actor(weights, observ):
    """TD3's mu(s) = tanh(MLP(s)), `[batch, action_size]`."""
    kernel, bias = weights["output"]
    return np.tanh(_mlp(weights["hidden"], observ) @ kernel + bias)


def q_network_weights(model):
    """The weights of a `QNetwork` without a dueling head."""
    assert not model._dueling
    return {"hidden": _mlp_weights(model._hidden), "advantage": _dense(model._advantage)}


def q_network(weights, observ):
    """Q(s, .), `[batch, num_actions]`."""
    kernel, bias = weights["advantage"]
    return _mlp(weights["hidden"], observ) @ kernel + bias


def variables(model):
    """Copies of the values of a model's variables, in order."""
    return [variable.numpy().astype(np.float64) for variable in model.variables]


def sac_target(actor, target_critic, log_alpha, batch, noise):
    """SAC's y = r + gamma_k (min_j Q'_j(s', a') - alpha log pi(a'|s')), a' from standard
    normal `noise` (Haarnoja et al. 2018, eq. 3, 5, with the clipped double Q)."""
    next_action, next_log_prob = squashed_sample(actor, batch["nextob"], noise)
    next_q = twin_q(target_critic, batch["nextob"], next_action).min(0)
    return batch["reward"] + batch["discount"] * (next_q - np.exp(log_alpha) * next_log_prob)


def td3_target(target_actor, target_critic, batch, noise, std, clip):
    """TD3's y = r + gamma_k min_j Q'_j(s', clip(mu'(s') + clip(std noise, -clip, clip),
    -1, 1)), `noise` standard normal (Fujimoto et al. 2018, eq. 14-15)."""
    smoothed = deterministic_actor(target_actor, batch["nextob"]) + np.clip(
        std * noise, -clip, clip)
    next_q = twin_q(target_critic, batch["nextob"], np.clip(smoothed, -1.0, 1.0))
    return batch["reward"] + batch["discount"] * next_q.min(0)


def dqn_target(q, target, batch, allowed, double):
    """DQN's y = r + gamma_k Q'(s', argmax over allowed a of Q(s', a)) with `double` (van
    Hasselt et al. 2016, eq. 4), else r + gamma_k max over allowed a of Q'(s', a) (Mnih et
    al. 2015); `allowed` bool `[batch, actions]`. Returns `(y, online Q(s', .), target
    Q'(s', .), the online network's pick)`."""
    online, values = q_network(q, batch["nextob"]), q_network(target, batch["nextob"])
    pick = np.where(allowed, online, -np.inf).argmax(-1)
    value = (values[np.arange(len(pick)), pick] if double
             else np.where(allowed, values, -np.inf).max(-1))
    return batch["reward"] + batch["discount"] * value, online, values, pick


def box_batch(size, actions, gamma, seed=0):
    """A hand-built batch of `size` (8) transitions with `actions`-sized Box actions:
    terminations (discount 0) and n-step discounts, unequal importance weights, and
    rewards whose TD errors fall on both sides of 1."""
    rng = np.random.default_rng(seed)
    return {
        "observ": rng.normal(size=(size, 3)).astype(np.float32),
        "action": rng.uniform(-0.9, 0.9, (size, actions)).astype(np.float32),
        "reward": np.array([3.0, -2.5, 0.1, -0.2, 1.5, 0.0, -4.0, 0.3], np.float32),
        "discount": np.array([gamma, 0.0, gamma ** 3, gamma, 0.0, gamma ** 2, gamma, gamma],
                             np.float32),
        "nextob": rng.normal(size=(size, 3)).astype(np.float32),
        "weight": rng.uniform(0.2, 1.0, size).astype(np.float32),
    }

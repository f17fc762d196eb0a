"""Exploration declared in the config: how an off-policy algorithm perturbs its actions
while training.

A spec is a mapping with a `type` and that type's keys (config key `exploration`):

- `{type: epsilon_decay, initial: 1.0, final: 0.05, steps: 10000}` (discrete actions): a
  uniformly random action with probability epsilon, which falls linearly from `initial` to
  `final` over the first `steps` environment steps and stays there (Mnih et al. 2015,
  "Human-level control through deep reinforcement learning", Methods);
- `{type: apex_epsilon, epsilon: 0.4, alpha: 7, first: 0, explorers: 0}` (discrete actions):
  epsilon-greedy with a fixed epsilon of its own for each agent, agent i of N explorers
  taking `epsilon^(1 + alpha i / (N - 1))` (`epsilon` alone when N = 1): Ape-X's actors'
  (Horgan et al. 2018, arXiv:1803.00933, sec. 4.1), from 0.4 down to 0.4^8 = 0.00066. `first`
  is the index of this batch's first agent and `explorers` N (0: the batch's agents); an
  actor-learner run sets both for each actor, so that the agents of all actors together
  span the range;
- `{type: gaussian, std: 0.1}` (`Box` actions in [-1, 1]): independent normal noise of
  standard deviation `std` added to each action element, then clipped to [-1, 1]
  (Fujimoto et al. 2018, arXiv:1802.09477, section 6.1);
- `{type: ornstein_uhlenbeck, theta: 0.15, std: 0.2, dt: 0.01}` (`Box` actions): temporally
  correlated noise per agent, x <- x - theta x dt + std sqrt(dt) N(0, 1), zeroed when an
  episode begins, added and clipped the same way (Lillicrap et al. 2016, arXiv:1509.02971,
  section 7);
- `{type: none}`: the policy's own action (SAC samples from its stochastic policy).

Exploration acts while training, never in deterministic acting (evaluation phases,
`Agent.act(deterministic=True)`, visualize) nor in an exported model's `serving_default`.
An exported model's `sample` signature draws as training acts, without state: DQN
epsilon-greedy with the schedule's `final` epsilon, TD3 its action plus normal noise of the
spec's `std` (also for `ornstein_uhlenbeck`, drawn anew at each call: a model keeps no noise
state), clipped to [-1, 1]; with `{type: none}` their `sample` is their deterministic action
(`batchrl.export.export_policy`).
"""

import numpy as np
import tensorflow as tf

# Each type's keys and their defaults.
TYPES = {
    "none": {},
    "epsilon_decay": {"initial": 1.0, "final": 0.05, "steps": 10000},
    "apex_epsilon": {"epsilon": 0.4, "alpha": 7.0, "first": 0, "explorers": 0},
    "gaussian": {"std": 0.1},
    "ornstein_uhlenbeck": {"theta": 0.15, "std": 0.2, "dt": 0.01},
}
_DISCRETE = ("none", "epsilon_decay", "apex_epsilon")
_INTEGERS = ("steps", "first", "explorers")
_CONTINUOUS = ("none", "gaussian", "ornstein_uhlenbeck")


def parse(spec, discrete):
    """The complete spec (defaults filled in) of the config's `exploration`.

    Args:
      spec: a mapping with key `type` and that type's keys, or None (`{type: none}`).
      discrete: bool, whether the actions are discrete (indices) or continuous.

    Returns:
      dict with `type` and every key of the type, as floats (`steps` an int).

    Raises:
      ValueError: an unknown type or key, a type that does not fit the actions, a
        negative value, or `steps` < 1; the message names the culprit.
    """
    spec = dict(spec or {"type": "none"})
    kind = spec.pop("type", None)
    if kind not in TYPES:
        raise ValueError(f"exploration: unknown type {kind!r}; choices: {', '.join(TYPES)}")
    allowed = _DISCRETE if discrete else _CONTINUOUS
    if kind not in allowed:
        actions = "discrete" if discrete else "continuous (Box)"
        raise ValueError(f"exploration type {kind!r} does not fit {actions} actions; "
                         f"choices: {', '.join(allowed)}")
    unknown = sorted(set(spec) - set(TYPES[kind]))
    if unknown:
        raise ValueError(f"exploration {kind}: unknown key(s) {', '.join(unknown)}; "
                         f"its keys: {', '.join(TYPES[kind]) or 'none'}")
    result = {"type": kind}
    for key, default in TYPES[kind].items():
        value = spec.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"exploration {kind}: {key} must be a number >= 0, got {value!r}")
        if key in _INTEGERS and value != int(value):
            raise ValueError(f"exploration {kind}: {key} must be an integer, got {value!r}")
        result[key] = int(value) if key in _INTEGERS else float(value)
    if kind == "epsilon_decay" and (result["steps"] < 1 or max(
            result["initial"], result["final"]) > 1):
        raise ValueError(f"exploration epsilon_decay: needs steps >= 1 and initial, final "
                         f"in [0, 1]; got {result}")
    if kind == "apex_epsilon" and result["epsilon"] > 1:
        raise ValueError(f"exploration apex_epsilon: epsilon must be in [0, 1], got "
                         f"{result['epsilon']}")
    return result


def apex_epsilons(spec, num_agents):
    """The epsilon of each of `num_agents` agents under an `apex_epsilon` spec: float32
    NumPy `[num_agents]`, agent i (index `first + i` of N = `explorers`, or of
    `num_agents` when that is 0) taking `epsilon^(1 + alpha (first + i) / (N - 1))`, or
    `epsilon` when N = 1 (Horgan et al. 2018, sec. 4.1)."""
    count = spec["explorers"] or num_agents
    index = spec["first"] + np.arange(num_agents)
    exponent = 1.0 + (spec["alpha"] * index / (count - 1) if count > 1 else 0.0 * index)
    return (spec["epsilon"] ** exponent).astype(np.float32)


def epsilon(spec, steps):
    """The exploration rate of an `epsilon_decay` spec after `steps` environment steps
    (int64 scalar tensor); float32 scalar."""
    fraction = tf.minimum(tf.cast(steps, tf.float32) / float(spec["steps"]), 1.0)
    return spec["initial"] + fraction * (spec["final"] - spec["initial"])


class Exploration(tf.Module):
    """The exploration of a spec for `num_agents` agents.

    Args:
      spec: a spec of `parse`.
      num_agents: int, agents whose actions are perturbed (one noise state each).
      action_shape: shape of one action (`()` for a discrete action).
      num_actions: int, the number of discrete actions (None for `Box` actions).
    """

    def __init__(self, spec, num_agents, action_shape, num_actions=None, name="exploration"):
        super().__init__(name=name)
        self.spec = spec
        self._num_actions = num_actions
        self._noise = None
        self._epsilons = None
        if spec["type"] == "apex_epsilon":
            self._epsilons = tf.constant(apex_epsilons(spec, num_agents))
        if spec["type"] == "ornstein_uhlenbeck":
            with self.name_scope:
                self._noise = tf.Variable(
                    tf.zeros((num_agents,) + tuple(action_shape)), trainable=False,
                    name="noise")

    def reset(self, agent_indices):
        """Zeroes the noise state of agents beginning an episode (int32 `[n]`); returns
        the operation (None when there is no state)."""
        if self._noise is None:
            return None
        rows = tf.cast(agent_indices, tf.int32)[:, None]
        zeros = tf.zeros(tf.concat([tf.shape(rows)[:1], tf.shape(self._noise)[1:]], 0))
        return self._noise.scatter_nd_update(rows, zeros)

    def __call__(self, agent_indices, action, steps, generator, allowed=None):
        """The explored actions.

        Args:
          agent_indices: int32 `[n]`, whose actions these are.
          action: the policy's actions, float32 `[n, *action_shape]` in [-1, 1] or int32
            `[n]` indices.
          steps: int64 scalar, environment steps trained so far (for `epsilon_decay`).
          generator: the `tf.random.Generator` to draw with.
          allowed: None, or bool `[n, num_actions]`, the actions an observation's mask
            allows: `epsilon_decay`'s random actions are drawn among them.

        Returns:
          Actions of the same shape and dtype.
        """
        kind = self.spec["type"]
        if kind == "none":
            return action
        if kind in ("epsilon_decay", "apex_epsilon"):
            rate = (epsilon(self.spec, steps) if kind == "epsilon_decay" else
                    tf.gather(self._epsilons, tf.cast(agent_indices, tf.int32)))
            chosen = epsilon_greedy(tf.cast(action, tf.int32), rate, generator, allowed,
                                    self._num_actions)
            return tf.cast(chosen, action.dtype)
        if kind == "gaussian":
            noise = self.spec["std"] * generator.normal(tf.shape(action))
            return tf.clip_by_value(action + noise, -1.0, 1.0)
        rows = tf.cast(agent_indices, tf.int32)[:, None]
        state = tf.gather_nd(self._noise, rows)
        theta, std, dt = self.spec["theta"], self.spec["std"], self.spec["dt"]
        state = state - theta * state * dt + std * dt ** 0.5 * generator.normal(
            tf.shape(state))
        with tf.control_dependencies([self._noise.scatter_nd_update(rows, state)]):
            return tf.clip_by_value(action + state, -1.0, 1.0)


def epsilon_greedy(greedy, rate, generator, allowed=None, num_actions=None):
    """Epsilon-greedy actions: each greedy action is replaced, with probability `rate`, by
    one drawn uniformly from the allowed actions (Mnih et al. 2015, Methods).

    Args:
      greedy: int32 `[...]`, the greedy actions.
      rate: float32, epsilon: a scalar or one per action (`[...]`).
      generator: the `tf.random.Generator` to draw with (first the random actions, then
        which to take; float draws only, as `batchrl.export`'s generator has).
      allowed: None, or bool `[..., num_actions]` (at least one True a row): the actions
        an observation's mask allows.
      num_actions: int, the number of actions when `allowed` is None.

    Returns:
      int32 `[...]`.
    """
    if allowed is None:  # Float draws only: exported models draw with float ops alone.
        random = tf.cast(tf.floor(generator.uniform(tf.shape(greedy)) * num_actions),
                         tf.int32)
        random = tf.minimum(random, num_actions - 1)
    else:
        random = uniform_allowed(allowed, generator)
    return tf.where(generator.uniform(tf.shape(greedy)) < rate, random, greedy)


def uniform_allowed(allowed, generator):
    """int32 `[n]`: for each row of bool `allowed` (`[n, num_actions]`, at least one True
    a row), one of its allowed actions, each equally likely (the largest of i.i.d. uniform
    draws, kept where allowed)."""
    draws = generator.uniform(tf.shape(allowed), 1e-6, 1.0)
    return tf.argmax(tf.where(allowed, draws, 0.0), -1, output_type=tf.int32)

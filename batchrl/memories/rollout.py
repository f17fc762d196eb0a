"""The rollout recording: each agent's consecutive steps in a row of its own, across the ends
of its episodes, until a row holds a rollout; the same in one process (an on-policy
algorithm with `rollout_length`) and in an actor (`batchrl.distributed.fragment`)."""

import tensorflow as tf

from batchrl.memories.episode import EpisodeMemory
from batchrl.tools.graph import after


def running_return(returns, agent_indices, reward, discount):
    """Advances each given agent's discounted return of its episode by one step,
    `G_t = discount * G_{t-1} + r_t` (Engstrom et al. 2020, arXiv:2005.12729, "reward
    scaling": what `reward_normalizer: return` takes the standard deviation of); the same
    in one process (`OnPolicyAlgorithm`) and in an actor (`FragmentRecorder`). Where an
    agent's episode begins, `zero_returns` clears its entry.

    Args:
      returns: float32 variable `[num_agents]`, each agent's `G_{t-1}`; updated.
      agent_indices: int32 `[n]`, distinct agents.
      reward: float32 `[n]`, their rewards `r_t`.
      discount: float.

    Returns:
      float32 `[n]`, their `G_t`, available once `returns` holds them.
    """
    agent_indices = tf.cast(agent_indices, tf.int32)
    updated = discount * tf.gather(returns, agent_indices) + reward
    return after([returns.scatter_nd_update(agent_indices[:, None], updated)], updated)


def zero_returns(returns, agent_indices):
    """Sets the given agents' entries of `returns` (float32 variable `[num_agents]`, as
    `running_return` keeps them) to 0, where their episodes begin; `agent_indices`: int32
    `[n]`. Returns the assign op."""
    rows = tf.cast(agent_indices, tf.int32)[:, None]
    return returns.scatter_nd_update(rows, tf.zeros([tf.shape(rows)[0]]))


class RolloutMemory(EpisodeMemory):
    """One row per agent of `num_agents`, each up to `max_length` steps: for every step the
    observation it was acted on and the one after it (the final observation where the step
    ended an episode), in the form `observ_specs` gives; the action; the raw reward; `done`
    (the step ended an episode: terminated, truncated, or cut short by `cut`) and
    `terminated`; and what the acting half stored of it (`OnPolicyActor.acting_specs`: the
    parameters of the distribution the action was drawn from and, for a recurrent policy,
    the state it was acted in).

    Args:
      observ_specs: callable taking a field name (`observ`, `next_observ`) and returning
        the dict of `(shape, dtype)` of the fields that store it (one field, or more for a
        nested observation, `ObservationStorage.specs`).
      action_spec: `(shape, dtype)` of one action.
      acting_specs: dict of `(shape, dtype)`, the acting half's fields.
      num_agents: int, the rows.
      max_length: int, the steps a row holds.
      name: the name scope of the variables.
    """

    def __init__(self, observ_specs, action_spec, acting_specs, num_agents, max_length,
                 name):
        template = {**observ_specs("observ"), "action": action_spec,
                    "reward": ((), tf.float32), **acting_specs,
                    **observ_specs("next_observ"), "done": ((), tf.bool),
                    "terminated": ((), tf.bool)}
        super().__init__(template, num_agents, max_length, name)

    def cut(self, agent_indices):
        """Sets `done` at the last stored step of the given agents' (int32 `[n]`) rows, if
        any: the episode in progress there is cut short (a phase begins new episodes), and
        the value of the observation after it bootstraps it. Returns the op."""
        rows = tf.cast(agent_indices, tf.int32)
        length = tf.gather(self.length, rows)
        stored = tf.boolean_mask(tf.stack([rows, length - 1], 1), length > 0)
        done = self.fields["done"]
        return done.scatter_nd_update(stored, tf.ones([tf.shape(stored)[0]], tf.bool))

    def full(self, rollout_length):
        """bool scalar: the first row holds `rollout_length` steps. A row that fell behind
        (an agent left out of a step, `batch_env.interrupted`) is read with the steps it
        has, as waiting for it would append past the memory's end in the others."""
        return tf.reduce_any(self.length >= rollout_length)

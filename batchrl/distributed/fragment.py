"""An actor's recording: `rollout_length` consecutive steps of every agent of its batch,
acted by its copy of the policy (the acting half), kept in the graph and read out as NumPy
arrays for a learner."""

import numpy as np
import tensorflow as tf

from batchrl.distributed.recorder import Recorder
from batchrl.memories.rollout import RolloutMemory, running_return, zero_returns
from batchrl.tools.graph import after


class FragmentRecorder(Recorder):
    """What `batchrl.drivers.simulate` drives in an actor: the policy of `actor` (an
    `batchrl.algorithms.actor.OnPolicyActor`) samples the actions, and every step of every
    agent is recorded, up to `length` steps per agent. Learns nothing.

    A fragment is a dict of NumPy arrays over `B` agents and `T = length` steps, each row
    one agent's consecutive steps across the ends of its episodes: `observ` and
    `next_observ` `[B, T, *observation_shape]` in the environment's dtype, raw (the
    observation a step was acted on, and the one after it: the final observation where
    the step ended an episode), sent in `compact`'s form (`expand` gives them back);
    `action` `[B, T, *action_shape]`; `reward` float32
    `[B, T]`; `done` and `terminated` bool `[B, T]`; `policy_<param>` float32
    `[B, T, ...]`, the parameters of the distribution the action was drawn from (mu);
    `length` int32 `[B]`, the steps of each row (`T` unless an agent was left out of a
    step, see `simulate`); and for a recurrent policy `state` float32
    `[B, T, state_size]`, the state each step was acted on (each agent's state runs on
    from fragment to fragment, zeroed where an episode begins); with `return_discount`,
    `return` float32 `[B, T]`, each agent's discounted return of its episode up to and
    including the step, `G_t = return_discount * G_{t-1} + r_t` (`G` zero where an episode
    begins; it runs on across fragments): what `reward_normalizer: return` takes the
    standard deviation of (Engstrom et al. 2020, arXiv:2005.12729, "reward scaling"), as
    the in-process algorithm does (`OnPolicyAlgorithm`).

    Args:
      batch_env: the actor's `InGraphBatchEnv`.
      actor: an `OnPolicyActor` built for the batch's spaces and agents (`num_agents`).
      length: int >= 1, the steps per agent of a fragment (`rollout_length`).
      return_discount: float (the config's `discount`) to record `return`, or None.

    Raises:
      ValueError: `actor` keeps acting state for another number of agents than the batch's.
    """

    def __init__(self, batch_env, actor, length, return_discount=None):
        if actor.num_agents != len(batch_env):
            raise ValueError(f"FragmentRecorder: the actor keeps acting state for "
                             f"{actor.num_agents} agents, the batch has {len(batch_env)} "
                             f"(OnPolicyActor's num_agents)")
        self._actor = actor
        observ = (tuple(batch_env.observ.shape[1:]), batch_env.observ.dtype)
        recorded = dict(actor.acting_specs)
        self._return_discount = return_discount
        if return_discount is not None:
            recorded["return"] = ((), tf.float32)
            self._return = tf.Variable(tf.zeros([len(batch_env)]), trainable=False,
                                       name="discounted_return")
        self._memory = RolloutMemory(
            lambda name: {name: observ},
            (tuple(batch_env.action.shape[1:]), batch_env.action.dtype),
            recorded, len(batch_env), int(length), "fragment")
        super().__init__(batch_env, length)

    def begin_episodes(self, agent_indices):
        """Zeroes the recurrent state (if any) and the discounted return (with
        `return_discount`) of the given agents (int32 `[n]`); their rows run on across the
        start of the episode."""
        begun = self._actor.begin_episodes(agent_indices)
        if self._return_discount is None:
            return begun
        return after([begun, zero_returns(self._return, agent_indices)], True)

    def perform(self, agent_indices, observ):
        """Actions sampled from the policy for the given agents (int32 `[n]`) in raw
        observations `[n, *observation_shape]` (`OnPolicyActor.perform`).

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        return self._actor.perform(agent_indices, observ, True)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Appends the step of the given agents to their rows."""
        agent_indices = tf.cast(agent_indices, tf.int32)
        step = {"observ": observ, "next_observ": nextob, "action": action, "reward": reward,
                "done": done,
                "terminated": tf.gather(self._batch_env.terminated, agent_indices),
                **self._actor.acted(agent_indices)}
        if self._return_discount is not None:
            step["return"] = running_return(self._return, agent_indices, reward,
                                            self._return_discount)
        return self._memory.append(step, agent_indices)

    def _collect_steps(self):
        with tf.control_dependencies(self._steps()):
            fields, length = self._memory.data()
        with tf.control_dependencies(list(fields.values()) + [length]):
            cleared = self._memory.clear()
        with tf.control_dependencies([cleared]):
            return ({key: tf.identity(value) for key, value in fields.items()},
                    tf.identity(length))

    def record(self):
        """Steps every agent `length` times, continuing their episodes, and returns the
        fragment as recorded (dict of NumPy arrays, see the class docstring)."""
        fields, length = self._collect()
        fragment = {key: np.asarray(value) for key, value in fields.items()}
        fragment["length"] = np.asarray(length)
        return fragment

    def collect(self):
        """`record`, in the form a fragment travels in (`compact`)."""
        return compact(self.record())


def compact(fragment):
    """The fragment as it travels: `next_observ` `[B, T, ...]` replaced by what `observ`
    does not hold. `observ` becomes `[B, T + 1, ...]`, column `length[b]` of row `b` being
    the observation after its last step (the final one if that step ended an episode;
    zeros past it); `final_observ` `[n, ...]` holds the final observations of the `n`
    episodes that ended before a row's last step, at the steps `final_step` int32
    `[n, 2]` (row, step). For image observations this halves the bytes sent. `expand` is
    the inverse."""
    fragment = dict(fragment)
    observ, next_observ = fragment["observ"], fragment.pop("next_observ")
    length = fragment["length"]
    rows = np.arange(len(length))
    extended = np.zeros((observ.shape[0], observ.shape[1] + 1) + observ.shape[2:],
                        observ.dtype)
    extended[:, :-1] = observ
    last = np.maximum(length - 1, 0)
    extended[rows, length] = np.where(
        (length > 0).reshape((-1,) + (1,) * (observ.ndim - 2)), next_observ[rows, last],
        extended[rows, length])
    before_last = np.arange(observ.shape[1])[None] < (length - 1)[:, None]
    final_step = np.argwhere(fragment["done"] & before_last).astype(np.int32)
    fragment.update(observ=extended, final_observ=next_observ[tuple(final_step.T)],
                    final_step=final_step)
    return fragment


def expand(fragment):
    """The fragment with `observ` and `next_observ` `[B, T, ...]` (as recorded) again, from
    `compact`'s form."""
    fragment = dict(fragment)
    extended = fragment["observ"]
    next_observ = extended[:, 1:].copy()
    final_step = fragment.pop("final_step")
    next_observ[tuple(final_step.T)] = fragment.pop("final_observ")
    fragment.update(observ=extended[:, :-1], next_observ=next_observ)
    return fragment

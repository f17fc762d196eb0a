"""An actor's recording: `rollout_length` consecutive steps of every agent of its batch,
acted by its copy of the policy (the acting half), kept in the graph and read out as NumPy
arrays for a learner."""

import numpy as np
import tensorflow as tf

from batchrl.algorithms.base import checked
from batchrl.drivers.simulate import episode_state, simulate_steps
from batchrl.memories.episode import EpisodeMemory
from batchrl.tools.graph import after


class FragmentRecorder:
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
    from fragment to fragment, zeroed where an episode begins).

    Args:
      batch_env: the actor's `InGraphBatchEnv`.
      actor: an `OnPolicyActor` built for the batch's spaces.
      length: int >= 1, the steps per agent of a fragment (`rollout_length`).
    """

    def __init__(self, batch_env, actor, length):
        self._batch_env = batch_env
        self._actor = actor
        self._length = int(length)
        agents = len(batch_env)
        observ = (tuple(batch_env.observ.shape[1:]), batch_env.observ.dtype)
        self._state_size = int(actor.networks.policy.state_size)
        params, _ = actor.networks.policy(
            tf.zeros((1, 1) + observ[0]), tf.zeros((1, self._state_size)))
        self._param_shapes = {key: tuple(value.shape[2:]) for key, value in params.items()}
        template = {"observ": observ, "next_observ": observ,
                    "action": (tuple(batch_env.action.shape[1:]), batch_env.action.dtype),
                    "reward": ((), tf.float32), "done": ((), tf.bool),
                    "terminated": ((), tf.bool)}
        for key, shape in self._param_shapes.items():
            template["policy_" + key] = (shape, tf.float32)
        if self._state_size:
            template["state"] = ((self._state_size,), tf.float32)
        self._memory = EpisodeMemory(template, agents, self._length, "fragment")
        self._last_params = {
            key: tf.Variable(tf.zeros((agents,) + shape), trainable=False, name="last_" + key)
            for key, shape in self._param_shapes.items()}
        # Each agent's recurrent state, and the one its last action was taken in.
        self._state, self._last_state = (
            tf.Variable(tf.zeros((agents, self._state_size)), trainable=False, name=name)
            for name in ("state", "last_state"))
        episode_state(batch_env)  # Its variables exist before the first trace.
        self._collect = tf.function(self._collect_steps, autograph=False)

    @property
    def length(self):
        """int, the steps per agent of a fragment."""
        return self._length

    def begin_episodes(self, agent_indices):
        """Zeroes the recurrent state (if any) of the given agents (int32 `[n]`); their
        rows run on across the start of the episode."""
        if not self._state_size:
            return tf.constant(True)
        rows = tf.cast(agent_indices, tf.int32)[:, None]
        return self._state.scatter_nd_update(
            rows, tf.zeros([tf.shape(rows)[0], self._state_size]))

    def perform(self, agent_indices, observ):
        """Actions sampled from the policy for the given agents (int32 `[n]`) in raw
        observations `[n, *observation_shape]`; keeps the parameters they were drawn from.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        agent_indices = tf.cast(agent_indices, tf.int32)
        state = tf.gather(self._state, agent_indices)
        action, new_state, params = self._actor.step_policy(observ, state, True)
        rows = agent_indices[:, None]
        stored = [self._last_params[key].scatter_nd_update(rows, params[key])
                  for key in self._param_shapes]
        if self._state_size:
            stored.append(self._last_state.scatter_nd_update(rows, state))
            with tf.control_dependencies(stored):
                stored.append(self._state.scatter_nd_update(rows, new_state))
        return after(stored, checked(action))

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Appends the step of the given agents to their rows."""
        agent_indices = tf.cast(agent_indices, tf.int32)
        step = {"observ": observ, "next_observ": nextob, "action": action, "reward": reward,
                "done": done,
                "terminated": tf.gather(self._batch_env.terminated, agent_indices)}
        for key in self._param_shapes:
            step["policy_" + key] = tf.gather(self._last_params[key], agent_indices)
        if self._state_size:
            step["state"] = tf.gather(self._last_state, agent_indices)
        return self._memory.append(step, agent_indices)

    def end_episodes(self, agent_indices):
        """Nothing to do: `done` of the step (`experience`) marks the end."""
        del agent_indices
        return tf.constant(True)

    def _collect_steps(self):
        steps = simulate_steps(self._batch_env, self, self._length, False, False)
        with tf.control_dependencies(list(steps)):
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

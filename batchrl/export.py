"""Exporting an algorithm's policy as a SavedModel for serving, free of batchrl."""

import gymnasium as gym
import numpy as np
import tensorflow as tf


def policy_action_space(action_space):
    """The action space the policy acts in: `Box(-1, 1)` for a `Box` with finite bounds (as
    `batchrl.tools.wrappers.standard_wrappers` gives `train`), else `action_space` itself."""
    if (isinstance(action_space, gym.spaces.Box) and np.isfinite(action_space.low).all()
            and np.isfinite(action_space.high).all()):
        return gym.spaces.Box(-1.0, 1.0, action_space.shape, np.float32)
    return action_space


def to_action_space(action, action_space):
    """Maps policy actions into `action_space`, inside the graph.

    For a `Box` with finite bounds, `action` (float32 `[n, *shape]`, in [-1, 1] by design)
    is clipped to [-1, 1] and mapped linearly onto [low, high]; other actions pass as they
    are.
    """
    if policy_action_space(action_space) is action_space:
        return action
    low = tf.constant(action_space.low, tf.float32)
    high = tf.constant(action_space.high, tf.float32)
    return low + (tf.clip_by_value(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)


class _ExportedPolicy(tf.Module):
    """The policy network and observation normalizer, with the serving functions."""

    def __init__(self, algo, observation_space, action_space, seed):
        super().__init__(name="policy")
        # The variables, not the Keras model: saving a Keras model traces its own serving
        # signature, which a policy of (observation, state) does not fit.
        self.policy_variables = list(algo.networks.policy.variables)
        self.observ_filter = algo.checkpoint_state["observ_filter"]
        self.generator = tf.random.Generator.from_seed(seed)
        observ_spec = tf.TensorSpec((None,) + tuple(observation_space.shape), tf.float32,
                                    name="observation")
        state_size = algo.state_size

        def act(observation, state, generator):
            action, state = algo.policy_action(observation, state, generator)
            return to_action_space(action, action_space), state

        if state_size:
            state_spec = tf.TensorSpec([None, state_size], tf.float32, name="state")

            def serve(generator):
                def function(observation, state):
                    action, state = act(observation, state, generator)
                    return {"action": action, "state": state}
                return tf.function(function, input_signature=[observ_spec, state_spec])
        else:
            def serve(generator):
                def function(observation):
                    state = tf.zeros([tf.shape(observation)[0], 0])
                    return {"action": act(observation, state, generator)[0]}
                return tf.function(function, input_signature=[observ_spec])

        self.deterministic = serve(None)
        self.sample = serve(self.generator)


def export_policy(algo, observation_space, action_space, directory, seed=0):
    """Writes the policy of `algo` as a SavedModel to `directory`.

    The model loads with `tf.saved_model.load` in a process that never imports batchrl. Its
    signatures take unnormalized observations (the observation normalizer is part of the
    model):

    - `serving_default`: `observation` float32 `[None, *observation_shape]` -> `action`, the
      mean (mode) action: float32 `[None, *action_shape]` within a bounded `Box`'s bounds,
      or int32 `[None]` for `Discrete`;
    - `sample`: the same, with a sampled action (a `tf.random.Generator` seeded with
      `seed`, part of the model).

    For a recurrent policy both also take `state` float32 `[None, state_size]` (zeros at
    the start of an episode) and return the next `state`.

    Args:
      algo: the algorithm (its `networks`, `checkpoint_state["observ_filter"]`,
        `state_size` and `policy_action`).
      observation_space, action_space: the spaces of one environment.
      directory: where to write the SavedModel.
      seed: int, the seed of the `sample` signature's generator.

    Returns:
      The directory, as given.
    """
    module = _ExportedPolicy(algo, observation_space, action_space, seed)
    tf.saved_model.save(module, str(directory), signatures={
        "serving_default": module.deterministic, "sample": module.sample})
    return directory

"""Exporting an algorithm's policy as a SavedModel for serving, free of batchrl."""

import tensorflow as tf

from batchrl import spaces


class _ExportedPolicy(tf.Module):
    """The policy network and observation normalizer, with the serving functions."""

    def __init__(self, algo, observation_space, action_space, seed):
        super().__init__(name="policy")
        # The variables, not the Keras model: saving a Keras model traces its own serving
        # signature, which a policy of (observation, state) does not fit.
        self.policy_variables = list(algo.networks.policy.variables)
        self.observ_filter = algo.checkpoint_state["observ_filter"]
        self.generator = tf.random.Generator.from_seed(seed)
        observ_spec = spaces.observation_spec(observation_space)
        state_size = algo.state_size

        def act(observation, state, generator):
            observ = spaces.to_policy_observation(observation, observation_space)
            action, state = algo.policy_action(observ, state, generator)
            action = spaces.to_action_space(action, action_space)
            return spaces.named_actions(action, action_space), state

        if state_size:
            state_spec = tf.TensorSpec([None, state_size], tf.float32, name="state")

            def serve(generator):
                def function(observation, state):
                    action, state = act(observation, state, generator)
                    return dict(action, state=state)
                return tf.function(function, input_signature=[observ_spec, state_spec])
        else:
            def serve(generator):
                def function(observation):
                    batch = tf.shape(tf.nest.flatten(observation)[0])[0]
                    return act(observation, tf.zeros([batch, 0]), generator)[0]
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

    Nested spaces (`Dict` / `Tuple`) have one input per observation leaf and one output per
    action leaf, named by the leaf's path (`batchrl.tools.nested.leaf_key`): e.g.
    `observation_angle` and `observation_velocity` for `Dict(angle=..., velocity=...)`,
    `action_move` and `action_kind` for `Dict(kind=..., move=...)`; dtypes as
    `batchrl.spaces.observation_spec` and `batchrl.spaces.to_action_space` give them
    (float32 `Box` leaves, int64 `Discrete` observation leaves, int32 `Discrete` action
    leaves, ...). A `Discrete` observation is an int64 `observation` `[None]`. The same
    functions, `model.deterministic` and `model.sample` of the loaded model, also take the
    nested observation itself (a dict / tuple of tensors, as the space says).

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

"""Exporting an algorithm's policy as a SavedModel for serving, free of batchrl."""

import contextlib

import keras
import tensorflow as tf

from batchrl import spaces


class _SeededNoise:
    """Random numbers from TensorFlow's seeded random ops, with the methods of a
    `tf.random.Generator` that the action distributions call (`normal`, `uniform`).

    The ops (`RandomStandardNormal`, `RandomUniform`) keep their place in the random stream
    in their kernel, not in a variable: the functions that draw with them change no
    variable, so that converters that freeze the variables take them, and TensorFlow Lite
    (`RANDOM_STANDARD_NORMAL`, `RANDOM_UNIFORM`) and ONNX (`RandomNormalLike`,
    `RandomUniformLike`) have them. Each op drawn gets its own seed pair `(seed, k)`, k =
    1, 2, ... in the order of the calls, so the components of a composite action are
    independent and a loaded model draws the same stream in every process.

    Args:
      seed: int, the first seed of every op.
    """

    def __init__(self, seed):
        self._seed = int(seed)
        self._ops = 0

    def _seeds(self):
        self._ops += 1  # Never (0, 0), which would seed the op at random.
        return {"seed": self._seed, "seed2": self._ops}

    def normal(self, shape, dtype=tf.float32):
        """Standard normal samples of `shape`, float32 (as `tf.random.Generator.normal`)."""
        return tf.raw_ops.RandomStandardNormal(shape=shape, dtype=dtype, **self._seeds())

    def uniform(self, shape, minval=0.0, maxval=1.0, dtype=tf.float32):
        """Samples of `shape` uniform in `[minval, maxval)`, float (as
        `tf.random.Generator.uniform` for float dtypes)."""
        unit = tf.raw_ops.RandomUniform(shape=shape, dtype=dtype, **self._seeds())
        return minval + (maxval - minval) * unit


def _tf_variable(variable):
    """The `tf.Variable` that holds the value of a Keras 3 variable (`variable.value`), or
    `variable` itself if it is one.

    The SavedModel must track these: it can save the Keras 3 wrapper instead, but
    `tf.lite.TFLiteConverter.from_saved_model` then leaves the wrapped variables resource
    variables (`VAR_HANDLE`) that nothing initializes, and the TFLite model reads garbage
    (NaN, zeros or 1e18 for every action).
    """
    return variable if isinstance(variable, tf.Variable) else variable.value


@contextlib.contextmanager
def _unrolled(model):
    """Within the context, the recurrent layers (`keras.layers.RNN`) of the Keras `model`
    unroll their loop over time.

    The exported functions run one step (a time dimension of static size 1): the unrolled
    step is the same arithmetic without the `tf.while_loop` over a tensor list, which
    `tf.lite.TFLiteConverter` cannot lower for a batch of unknown size.
    """
    layers = [layer for layer in model._flatten_layers()
              if isinstance(layer, keras.layers.RNN) and not layer.unroll]
    for layer in layers:
        layer.unroll = True
    try:
        yield
    finally:
        for layer in layers:
            layer.unroll = False


class _ExportedPolicy(tf.Module):
    """The policy network and observation normalizer, with the serving functions, none of
    which changes a variable."""

    def __init__(self, algo, observation_space, action_space, seed):
        super().__init__(name="policy")
        # The variables, not the Keras model: saving a Keras model traces its own serving
        # signature, which a policy of (observation, state) does not fit.
        self.policy_variables = [_tf_variable(v) for v in algo.networks.policy.variables]
        self.observ_filter = algo.checkpoint_state["observ_filter"]
        observ_spec = spaces.observation_spec(observation_space)
        state_size = algo.state_size

        def act(observation, state, sampled):
            observ = spaces.to_policy_observation(observation, observation_space)
            noise = _SeededNoise(seed) if sampled else None
            action, state = algo.policy_action(observ, state, noise)
            action = spaces.to_action_space(action, action_space)
            return spaces.named_actions(action, action_space), state

        if state_size:
            state_spec = tf.TensorSpec([None, state_size], tf.float32, name="state")

            def serve(sampled):
                def function(observation, state):
                    action, state = act(observation, state, sampled)
                    return dict(action, state=state)
                return tf.function(function, input_signature=[observ_spec, state_spec],
                                   autograph=False)
        else:
            def serve(sampled):
                def function(observation):
                    batch = tf.shape(tf.nest.flatten(observation)[0])[0]
                    return act(observation, tf.zeros([batch, 0]), sampled)[0]
                return tf.function(function, input_signature=[observ_spec], autograph=False)

        self.deterministic = serve(False)
        self.sample = serve(True)


def export_policy(algo, observation_space, action_space, directory, seed=0):
    """Writes the policy of `algo` as a SavedModel to `directory`.

    The model loads with `tf.saved_model.load` in a process that never imports batchrl. Its
    signatures take unnormalized observations (the observation normalizer is part of the
    model):

    - `serving_default`: `observation` float32 `[None, *observation_shape]` (uint8 for a
      uint8 or bool `Box`: frames, with the preprocessing inside) -> `action`, the mean
      (mode) action: float32 `[None, *action_shape]` within a bounded `Box`'s bounds,
      or int32 `[None]` for `Discrete`;
    - `sample`: the same, with a sampled action, drawn with TensorFlow's seeded random ops
      (seeded with `seed`; each call draws anew, and every process that loads the model
      draws the same sequence): from the policy's distribution (PPO, TRPO, A2C, SAC), or,
      for a deterministic policy, with its exploration (DQN: epsilon-greedy with the
      schedule's final epsilon; TD3: normal noise of the exploration's `std`; none with
      `{type: none}`; `batchrl.algorithms.exploration`). `serving_default` never
      explores.

    For a recurrent policy both also take `state` float32 `[None, state_size]` (zeros at
    the start of an episode) and return the next `state`.

    No signature changes a variable, so that the standard conversions take the model and
    act as the policy does: `tf.lite.TFLiteConverter.from_saved_model(directory,
    signature_keys=["serving_default"])` (or `["sample"]`) for TensorFlow Lite, and
    `python -m tf2onnx.convert --saved-model DIR --signature_def serving_default --output
    FILE` for ONNX (a recurrent policy's output `state` needs another name there, as
    `--rename-outputs action,next_state` gives it: an ONNX graph's input and output cannot
    share a name).

    Nested spaces (`Dict` / `Tuple`) have one input per observation leaf and one output per
    action leaf, named by the leaf's path (`batchrl.spaces.nested.leaf_key`): e.g.
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
      seed: int, the seed of the `sample` signature's random ops.

    Returns:
      The directory, as given.
    """
    module = _ExportedPolicy(algo, observation_space, action_space, seed)
    with _unrolled(algo.networks.policy):  # Saving traces the functions.
        tf.saved_model.save(module, str(directory), signatures={
            "serving_default": module.deterministic, "sample": module.sample})
    return directory

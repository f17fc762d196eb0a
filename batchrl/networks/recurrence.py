"""A recurrent cell run over the time axis with its state zeroed where an episode begins, so
that one row of consecutive steps that runs across episode ends (an actor's fragment, a
rollout) is replayed as the agents acted, with gradients through time inside each episode.

The mask of R2D2 (Kapturowski et al., "Recurrent Experience Replay in Distributed
Reinforcement Learning", ICLR 2019, section 3: sequences that cross episode boundaries) and
of Sample Factory's recurrent rollouts (Petrenko et al., ICML 2020)."""

import tensorflow as tf


def unroll(cell, inputs, state, reset, lstm=False):
    """Runs `cell` over the steps of `inputs` from `state`, zeroing the state before each
    step where `reset` is True:

        h_t = cell(x_t, (1 - reset_t) * h_{t-1}),  h_{-1} = state.

    Gradients flow from every step to the steps before it and to `state`, and stop at a
    reset (the state there is zero, whatever came before).

    Args:
      cell: a Keras recurrent cell (`keras.layers.GRUCell` or `LSTMCell`), built.
      inputs: float32 `[batch, time, features]`.
      state: float32 `[batch, state_size]`, the state before the first step (an LSTM's
        `h` and `c` side by side).
      reset: bool `[batch, time]`, True at the steps that begin an episode.
      lstm: bool, `cell` is an LSTM cell.

    Returns:
      `(outputs, state)`: float32 `[batch, time, units]`, each step's output, and the
      state after the last step, `[batch, state_size]`.
    """
    keep = 1.0 - tf.cast(reset, tf.float32)

    def step(carried, step_inputs):
        state, _ = carried
        features, kept = step_inputs
        state = state * kept[:, None]
        if lstm:
            output, (h, c) = cell(features, list(tf.split(state, 2, axis=-1)))
            return tf.concat([h, c], -1), output
        output, new_state = cell(features, [state])
        return new_state[0], output

    units = state.shape[-1] // 2 if lstm else state.shape[-1]
    first = (state, tf.zeros(tf.concat([tf.shape(inputs)[:1], [units]], 0), inputs.dtype))
    states, outputs = tf.scan(
        step, (tf.transpose(inputs, [1, 0, 2]), tf.transpose(keep)), initializer=first)
    return tf.transpose(outputs, [1, 0, 2]), states[-1]

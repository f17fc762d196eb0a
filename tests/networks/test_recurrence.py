"""`batchrl.networks.recurrence.unroll` and the policies' `reset`: a row that runs across
episode starts is replayed as the agents acted (the state zeroed where an episode begins),
against a step-by-step NumPy GRU and LSTM, and its gradients flow through time inside an
episode and stop at its start."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from batchrl.networks.policies import RecurrentGaussianPolicy
from batchrl.networks.recurrence import unroll

ROWS, TIME, FEATURES, UNITS = 3, 7, 4, 5
# Episodes begin inside the rows at these steps (row, step); row 2 has none.
RESETS = [(0, 3), (1, 1), (1, 5)]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gru_step(cell, x, h):
    """Keras' GRU with `reset_after` (its default): gates z, r, candidate in that order of
    the kernels' columns; input and recurrent biases apart."""
    kernel, recurrent, bias = (v.numpy().astype(np.float64) for v in cell.weights)
    inner = x @ kernel + bias[0]
    hidden = h @ recurrent + bias[1]
    z = _sigmoid(inner[:, :UNITS] + hidden[:, :UNITS])
    r = _sigmoid(inner[:, UNITS:2 * UNITS] + hidden[:, UNITS:2 * UNITS])
    candidate = np.tanh(inner[:, 2 * UNITS:] + r * hidden[:, 2 * UNITS:])
    return z * h + (1 - z) * candidate


def _lstm_step(cell, x, state):
    """Keras' LSTM: gates i, f, c, o in that order; the state `h` and `c` side by side."""
    kernel, recurrent, bias = (v.numpy().astype(np.float64) for v in cell.weights)
    h, c = state[:, :UNITS], state[:, UNITS:]
    gates = x @ kernel + h @ recurrent + bias
    i, f, g, o = (gates[:, k * UNITS:(k + 1) * UNITS] for k in range(4))
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
    return np.concatenate([h, c], -1)


def _reference(step, inputs, state, reset, width):
    """Step by step: the state zeroed before a step that begins an episode."""
    outputs = np.zeros((ROWS, TIME, UNITS))
    state = state.astype(np.float64)
    for t in range(TIME):
        state = np.where(reset[:, t:t + 1], 0.0, state)
        state = step(inputs[:, t].astype(np.float64), state)
        outputs[:, t] = state[:, :UNITS]
    assert state.shape[-1] == width
    return outputs, state


def _data(width):
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(ROWS, TIME, FEATURES)).astype(np.float32)
    state = rng.normal(size=(ROWS, width)).astype(np.float32)
    reset = np.zeros((ROWS, TIME), bool)
    for row, t in RESETS:
        reset[row, t] = True
    return inputs, state, reset


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_an_unrolled_row_equals_the_numpy_cell_stepped_with_resets(kind):
    keras.utils.set_random_seed(1)
    lstm = kind == "lstm"
    cell = keras.layers.LSTMCell(UNITS) if lstm else keras.layers.GRUCell(UNITS)
    width = 2 * UNITS if lstm else UNITS
    cell.build((None, FEATURES))
    inputs, state, reset = _data(width)
    outputs, final = unroll(cell, tf.constant(inputs), tf.constant(state), tf.constant(reset),
                            lstm)
    want, want_final = _reference(
        lambda x, s: _lstm_step(cell, x, s) if lstm else _gru_step(cell, x, s),
        inputs, state, reset, width)
    np.testing.assert_allclose(outputs.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(final.numpy(), want_final, rtol=1e-5, atol=1e-5)
    # The resets matter: without them row 0 differs from step 3 on.
    unreset, _ = _reference(
        lambda x, s: _lstm_step(cell, x, s) if lstm else _gru_step(cell, x, s),
        inputs, state, np.zeros_like(reset), width)
    assert np.abs(unreset[0, 3:] - want[0, 3:]).max() > 1e-3
    np.testing.assert_allclose(unreset[2], want[2], rtol=1e-5, atol=1e-5)


def test_a_policy_replays_a_row_as_it_acted_step_by_step():
    """`RecurrentGaussianPolicy(observ, state, reset=...)` over a row equals acting one step
    at a time from the zero state at each episode's start (what an actor does)."""
    keras.utils.set_random_seed(2)
    policy = RecurrentGaussianPolicy(2, [8, UNITS], 0.5, 0.1)
    inputs, state, reset = _data(UNITS)
    policy(tf.constant(inputs[:, :1]), tf.constant(state))
    params, _ = policy(tf.constant(inputs), tf.constant(state), reset=tf.constant(reset))
    acted = np.zeros((ROWS, TIME, 2), np.float32)
    carried = tf.constant(state)
    for t in range(TIME):
        carried = tf.where(tf.constant(reset[:, t:t + 1]), 0.0, carried)
        step, carried = policy(tf.constant(inputs[:, t:t + 1]), carried)
        acted[:, t] = step["mean"][:, 0].numpy()
    np.testing.assert_allclose(params["mean"].numpy(), acted, rtol=1e-5, atol=1e-6)


def test_gradients_flow_through_time_inside_an_episode_and_stop_at_its_start():
    keras.utils.set_random_seed(3)
    cell = keras.layers.GRUCell(UNITS)
    cell.build((None, FEATURES))
    inputs, state, reset = _data(UNITS)
    inputs = tf.constant(inputs)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        outputs, _ = unroll(cell, inputs, tf.constant(state), tf.constant(reset))
        last = tf.reduce_sum(outputs[:, -1])
    gradient = np.abs(tape.gradient(last, inputs).numpy()).sum(-1)
    assert (gradient[2] > 0).all()  # No reset: every step reaches the last.
    assert (gradient[0, 3:] > 0).all() and (gradient[0, :3] == 0).all()  # Reset at 3.
    assert (gradient[1, 5:] > 0).all() and (gradient[1, :5] == 0).all()  # Reset at 5.

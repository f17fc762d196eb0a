import tensorflow as tf

from batchrl.tools.graph import TracedCall, after


def test_after_adds_the_dependencies_as_control_inputs_and_ignores_none():
    with tf.Graph().as_default():  # No automatic control dependencies here.
        first = tf.no_op(name="first")
        second = tf.constant(1.0, name="second")
        value = tf.constant(2.0)
        result = after([None, {"op": first, "tensor": second, "none": None}],
                       {"value": value, "pair": (value,)})
        assert set(result) == {"value", "pair"} and len(result["pair"]) == 1
        for tensor in (result["value"], result["pair"][0]):
            assert tensor.op.type == "Identity"
            assert {op.name for op in tensor.op.control_inputs} == {"first", "second"}
        with tf.compat.v1.Session() as session:
            assert session.run(result)["value"] == 2.0


def test_traced_call_runs_the_traced_graph_and_the_python_function_when_eager():
    """Traced once at the first call and then run as a graph (the Python function's body
    runs only while tracing); while functions run eagerly, the Python function runs at
    every call and nothing is traced."""
    runs = []

    def double(x):
        runs.append(1)
        return 2 * x

    spec = [tf.TensorSpec([2], tf.float32)]
    call = TracedCall(tf.function(double, input_signature=spec, autograph=False))
    for value in ([1.0, 2.0], [3.0, 4.0], [5.0, 6.0]):
        assert call(tf.constant(value)).numpy().tolist() == [2 * v for v in value]
    assert len(runs) == 1 and call.experimental_get_tracing_count() == 1

    eager = TracedCall(tf.function(double, input_signature=spec, autograph=False))
    runs.clear()
    tf.config.run_functions_eagerly(True)
    try:
        assert eager(tf.constant([1.0, 2.0])).numpy().tolist() == [2.0, 4.0]
        eager(tf.constant([1.0, 2.0]))
    finally:
        tf.config.run_functions_eagerly(False)
    assert len(runs) == 2 and eager.experimental_get_tracing_count() == 0

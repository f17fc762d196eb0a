import tensorflow as tf

from batchrl.tools.graph import after


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

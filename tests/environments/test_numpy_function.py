import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import script_ops

from batchrl.environments import numpy_function


class _Subclass(np.ndarray):
    pass


# What the functions of `tf.numpy_function` return; TensorFlow's registry converts each
# with `dtype=None`.
VALUES = {
    "float32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "bool": np.array([True, False]),
    "int64": np.arange(3),
    "uint8": np.arange(3, dtype=np.uint8),
    "complex": np.array([1 + 2j]),
    "float scalar array": np.array(1.5),
    "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    "every other": np.arange(6, dtype=np.float64)[::2],
    "bytes": np.array([b"a", b"bc"]),
    "str": np.array(["a", "bc"]),
    "object": np.array([1, "a"], dtype=object),
    "list": [1.0, 2.0],
    "python float": 2.5,
    "numpy scalar": np.float32(2.5),
    "subclass": np.eye(2).view(_Subclass),
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_conversion_returns_what_tensorflow_returns(name):
    value = VALUES[name]
    expected = numpy_function._TENSORFLOW_CONVERT(value)
    converted = numpy_function._convert(value)
    assert type(converted) is type(expected)
    assert converted.dtype == expected.dtype and converted.shape == expected.shape
    assert converted.flags.c_contiguous == expected.flags.c_contiguous
    assert (converted is value) == (expected is value)
    if expected.dtype != object:
        np.testing.assert_array_equal(converted, expected)
    else:
        assert converted.tolist() == expected.tolist()


def test_contiguous_numeric_arrays_are_returned_without_a_call(monkeypatch):
    calls = []
    monkeypatch.setattr(numpy_function, "_TENSORFLOW_CONVERT",
                        lambda value, dtype=None: calls.append(value) or np.asarray(value))
    value = VALUES["float32"]
    assert numpy_function._convert(value) is value
    assert calls == []
    numpy_function._convert(VALUES["transposed"])
    assert len(calls) == 1


def test_numpy_functions_return_the_same_tensors_with_the_faster_conversion():
    outputs = (VALUES["float32"], VALUES["bool"], VALUES["transposed"], VALUES["bytes"])

    @tf.function(autograph=False)
    def call():
        return tf.numpy_function(lambda: outputs, [],
                                 [tf.float32, tf.bool, tf.float32, tf.string])

    numpy_function.skip_needless_output_conversions()
    numpy_function.skip_needless_output_conversions()  # Again: no change.
    assert script_ops._py_funcs._convert is numpy_function._convert
    for tensor, value in zip(call(), outputs, strict=True):
        np.testing.assert_array_equal(tensor.numpy(), value)


def test_tensorflow_threads_keep_their_python_thread_state():
    # A thread-local value lives in the Python thread state: it survives from one call to
    # the next on the same TensorFlow thread only if that state is kept between calls.
    local = threading.local()
    calls = []

    def record(x):
        numpy_function.keep_python_thread_state()
        calls.append((threading.get_ident(), getattr(local, "thread", None)))
        local.thread = threading.get_ident()
        return x + 1

    @tf.function(autograph=False)
    def call(x):
        return tf.numpy_function(record, [x], tf.int32)

    assert [int(call(tf.constant(i))) for i in range(20)] == list(range(1, 21))
    first_calls = {}
    for thread, remembered in calls:
        if thread in first_calls:
            assert remembered == thread  # Set by the previous call on this thread.
        first_calls.setdefault(thread, remembered)
    repeated = [thread for thread, _ in calls[1:] if thread != threading.get_ident()]
    assert len(repeated) > len(set(repeated))  # Some TensorFlow thread ran several calls.

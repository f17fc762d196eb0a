"""Cheaper `tf.numpy_function` calls, for the environment steps run inside the graph.

`InGraphBatchEnv` calls Python through `tf.numpy_function` at every batch step, so the
fixed cost of such a call is paid on every step. Two parts of that cost are TensorFlow's
own bookkeeping, not work of the call, and are removed here:

- `keep_python_thread_state`: the Python thread state TensorFlow creates and destroys
  around every call;
- `skip_needless_output_conversions`: the conversion TensorFlow's registry applies to every
  returned array, which parses NumPy's version string with a regular expression each time.
"""

import ctypes
import threading

import numpy as np
from tensorflow.python.ops import script_ops

# TensorFlow threads that run `tf.numpy_function`s and keep their Python thread state.
_THREADS_WITH_STATE = set()

# NumPy dtype kinds that TensorFlow's conversion returns unchanged: bool, signed and
# unsigned integers, floats and complex numbers (not bytes, str or object arrays).
_NUMERIC_KINDS = frozenset("biufc")


def keep_python_thread_state():
    """Keeps the Python thread state of the calling TensorFlow thread alive between calls.

    Call it first in a function run by `tf.numpy_function`. TensorFlow runs such a function
    on one of its own threads with `PyGILState_Ensure` / `PyGILState_Release`; for a thread
    unknown to Python these create and destroy a whole thread state around every call, a
    large part of a cheap environment step (docs/throughput.md, "Why the code is as it is"). One
    extra `PyGILState_Ensure`, never released, makes the state outlive the call: later
    calls only take the GIL. It holds one thread state per TensorFlow thread (a few), freed
    when the interpreter exits.
    """
    thread = threading.get_ident()
    if thread not in _THREADS_WITH_STATE:  # Runs with the GIL held: no race.
        ctypes.pythonapi.PyGILState_Ensure()
        _THREADS_WITH_STATE.add(thread)


_TENSORFLOW_CONVERT = script_ops.FuncRegistry._convert


def _convert(value, dtype=None):
    """TensorFlow's `FuncRegistry._convert`, returning a C-contiguous numeric `ndarray`
    as it is, without the call that returns it unchanged anyway."""
    if (dtype is None and type(value) is np.ndarray and value.dtype.kind in _NUMERIC_KINDS
            and value.flags.c_contiguous):
        return value
    return _TENSORFLOW_CONVERT(value, dtype)


def skip_needless_output_conversions():
    """Makes TensorFlow return the arrays of `tf.numpy_function`s without a needless call.

    TensorFlow's registry of Python functions (`script_ops._py_funcs`) converts each
    returned value with `numpy_compat.np_asarray(value, order="C")`, which builds a
    `numpy.lib.NumpyVersion` (a regular expression match) on every call, for every output
    (docs/throughput.md, "Why the code is as it is"). For a C-contiguous `ndarray` of a
    numeric or bool dtype that call returns the array itself; this returns it directly and
    leaves every other value to TensorFlow's conversion, so the results are the same
    objects as before. It applies to every `tf.numpy_function` of the process, and calling
    it again does nothing.
    """
    script_ops._py_funcs._convert = _convert

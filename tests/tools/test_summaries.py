"""`summaries.histogram` writes what `tf.summary.histogram` (TensorBoard's) writes.

Each test writes the same histograms with both into separate event files and compares what
TensorBoard's `EventAccumulator` reads back: tags, steps, plugin metadata and tensors. The
tensors are compared bitwise (NaN equal to NaN): `summaries.histogram` does TensorBoard's
float64 arithmetic in the same order (offsets / width, floor, clamp; edges
`min + width * i`, the last exactly `max`), so there is no rounding to allow for.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from batchrl.tools import summaries

_RNG = np.random.default_rng(0)
_CASES = {  # name: (data, buckets)
    "normal": (_RNG.normal(size=1000).astype(np.float32), 30),
    "empty": (np.zeros([0], np.float32), 30),
    "equal": (np.full([5], 2.5, np.float32), 30),
    "integer": (_RNG.integers(-5, 9, size=100).astype(np.int32), 30),
    "matrix": (_RNG.normal(2.0, 3.0, size=(7, 13)).astype(np.float32), 30),
    "few_buckets": (_RNG.uniform(size=50), 4),
    "nan": (np.array([1.0, np.nan, 2.0]), 30),
    "inf": (np.array([1.0, 2.0, np.inf]), 30),
}


def _read(directory):
    """{tag: [(step, float64 array, plugin name, plugin content)]} of the event files."""
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    result = {}
    for tag in accumulator.Tags()["tensors"]:
        plugin = accumulator.SummaryMetadata(tag).plugin_data
        result[tag] = [(event.step, tensor_util.make_ndarray(event.tensor_proto),
                        plugin.plugin_name, plugin.content)
                       for event in accumulator.Tensors(tag)]
    return result


def _assert_same(actual, expected):
    assert sorted(actual) == sorted(expected)
    for tag, events in expected.items():
        assert len(actual[tag]) == len(events), tag
        for (step, array, plugin, content), (step_, array_, plugin_, content_) in zip(
                actual[tag], events, strict=True):
            assert (step, plugin, content) == (step_, plugin_, content_), tag
            assert plugin == "histograms"
            assert array.dtype == array_.dtype == np.float64, tag
            assert array.shape == array_.shape, tag
            np.testing.assert_array_equal(array, array_, err_msg=tag)


def _write_both(tmp_path, write):
    """Runs `write(histogram)` under a file writer at step 3 with each of the two
    histograms; returns what was read back of (ours, TensorBoard's)."""
    read = []
    for name, histogram in (("ours", summaries.histogram), ("tb", tf.summary.histogram)):
        writer = tf.summary.create_file_writer(str(tmp_path / name))
        with writer.as_default(step=3):
            write(histogram)
        writer.close()
        read.append(_read(tmp_path / name))
    return read


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_histograms_read_back_as_tensorboards(tmp_path, mode):
    def write_all(histogram, *values):
        with tf.name_scope("ppo/"), tf.name_scope("inner"):
            for (name, (_, buckets)), value in zip(_CASES.items(), values, strict=True):
                histogram(name, value, buckets=buckets)

    values = [tf.constant(data) for data, _ in _CASES.values()]
    if mode == "eager":
        ours, tb = _write_both(tmp_path, lambda histogram: write_all(histogram, *values))
    else:
        # Unknown shapes, so that nothing is known about the data while tracing.
        specs = [tf.TensorSpec(None, value.dtype) for value in values]
        ours, tb = _write_both(tmp_path, lambda histogram: tf.function(
            lambda *args: write_all(histogram, *args), autograph=False,
            input_signature=specs)(*values))
    assert sorted(tb) == sorted(f"ppo/inner/{name}" for name in _CASES)
    _assert_same(ours, tb)
    # Against the format itself: total counts, shapes, and the two special cases.
    for name, (data, buckets) in _CASES.items():
        (_, array, _, _), = ours[f"ppo/inner/{name}"]
        assert array.shape == (buckets, 3)
        if name not in ("nan", "inf"):
            assert array[:, 2].sum() == data.size, name
    assert not ours["ppo/inner/empty"][0][1].any()
    np.testing.assert_array_equal(ours["ppo/inner/equal"][0][1],
                                  [[2.5, 2.5, 0.0]] * 29 + [[2.5, 2.5, 5.0]])
    (_, normal, _, _), = ours["ppo/inner/normal"]
    data = _CASES["normal"][0].astype(np.float64)
    assert normal[0, 0] == data.min() and normal[-1, 1] == data.max()
    np.testing.assert_array_equal(normal[1:, 0], normal[:-1, 1])


def test_hand_computed_buckets():
    """[0, 1, 2, 3, 4] in 4 buckets of width 1: the last bucket is closed, so it holds 3
    and 4; [0, 1, 3] in 2 buckets of width 1.5: 1 < 1.5 is in the first."""
    np.testing.assert_array_equal(
        summaries.histogram_buckets(tf.constant([4, 0, 2, 1, 3]), 4).numpy(),
        [[0, 1, 1], [1, 2, 1], [2, 3, 1], [3, 4, 2]])
    np.testing.assert_array_equal(
        summaries.histogram_buckets(tf.constant([[0.0, 1.0], [3.0, 3.0]]), 2).numpy(),
        [[0, 1.5, 2], [1.5, 3, 2]])
    with pytest.raises(ValueError, match="buckets must be positive"):
        summaries.histogram("h", tf.constant([1.0]), buckets=0)


def test_in_cond_and_while_branches(tmp_path):
    """Written from a `tf.cond` branch and at the step of each `tf.while_loop` iteration."""
    def write(histogram):
        @tf.function(autograph=False)
        def run(data):
            tf.cond(tf.size(data) > 0, lambda: histogram("cond", data),
                    lambda: tf.constant(False))

            def body(i):
                histogram("loop", data * tf.cast(i, tf.float32), step=tf.cast(i, tf.int64))
                return i + 1

            tf.while_loop(lambda i: i < 3, body, [tf.constant(0)])

        run(tf.constant(_CASES["normal"][0]))

    ours, tb = _write_both(tmp_path, write)
    # The tags are under the branches' name scopes, TensorBoard's as ours.
    assert {tag: [event[0] for event in events] for tag, events in tb.items()} == {
        "cond/cond": [3], "while/loop": [0, 1, 2]}
    _assert_same(ours, tb)


def test_record_if_false_writes_nothing(tmp_path):
    """As under the Loop: `record_if` of a variable, false at step 1, true at step 2."""
    should_log = tf.Variable(False)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(autograph=False)
    def run(data, step):
        with writer.as_default(step=step), tf.summary.record_if(should_log):
            return summaries.histogram("h", data)

    data = tf.constant([1.0, 2.0])
    assert not bool(run(data, tf.constant(1, tf.int64)))
    should_log.assign(True)
    assert bool(run(data, tf.constant(2, tf.int64)))
    with writer.as_default(step=4), tf.summary.record_if(False):
        assert not summaries.histogram("h", data)  # Eagerly.
    writer.close()
    assert [event[0] for event in _read(tmp_path)["h"]] == [2]


def test_graph_is_a_fraction_of_tensorboards(tmp_path):
    """Nodes of a `tf.function` writing one histogram (function bodies included): 54 for
    ours, 175 for TensorBoard's in TensorFlow 2.21, 14 of them the write both share."""
    writer = tf.summary.create_file_writer(str(tmp_path))

    def nodes(histogram):
        def write(data):
            with writer.as_default(step=0):
                return histogram("h", data)

        graph = tf.function(write, autograph=False).get_concrete_function(
            tf.TensorSpec([None], tf.float32)).graph.as_graph_def()
        return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)

    ours, tb = nodes(summaries.histogram), nodes(tf.summary.histogram)
    assert ours < 70, ours
    assert tb > 2 * ours, (ours, tb)

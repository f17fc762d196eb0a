import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import tensorflow as tf

from batchrl.tools.streaming import StreamingMean, StreamingNormalize


def test_streaming_mean_matches_numpy_and_clears():
    rng = np.random.default_rng(0)
    mean = StreamingMean((3,))
    batches = [rng.normal(size=(n, 3)).astype(np.float32) for n in (5, 0, 7, 1)]
    for batch in batches:
        mean.submit(batch)
    values = np.concatenate(batches)
    assert int(mean.count) == len(values)
    np.testing.assert_allclose(mean.value.numpy(), values.mean(0), rtol=1e-5, atol=1e-6)
    cleared = mean.clear()
    np.testing.assert_allclose(cleared.numpy(), values.mean(0), rtol=1e-5, atol=1e-6)
    assert int(mean.count) == 0
    np.testing.assert_array_equal(mean.value.numpy(), np.zeros(3))


@pytest.mark.parametrize("shape", [(), (2,), (2, 3)])
def test_streaming_normalize_statistics_match_numpy(shape):
    rng = np.random.default_rng(1)
    normalize = StreamingNormalize(shape, center=True, scale=True)
    batches = [rng.normal(3.0, 2.0, size=(n,) + shape) for n in (1, 10, 0, 33, 2)]

    @tf.function
    def update(values):
        return normalize.update(values)

    for batch in batches:
        update(tf.constant(batch, tf.float32))
    values = np.concatenate(batches).astype(np.float32).astype(np.float64)
    assert int(normalize.count) == len(values)
    np.testing.assert_allclose(normalize.mean.numpy(), values.mean(0), rtol=1e-5)
    np.testing.assert_allclose(normalize.std.numpy(), values.std(0, ddof=1), rtol=1e-5)
    sample = rng.normal(size=(4,) + shape).astype(np.float32)
    expected = (sample - values.mean(0)) / (values.std(0, ddof=1) + 1e-8)
    np.testing.assert_allclose(normalize.transform(sample).numpy(), expected, rtol=1e-4,
                               atol=1e-5)


def test_streaming_normalize_options_and_clip():
    normalize = StreamingNormalize((), center=False, scale=True, clip=2.0)
    values = np.array([1.0, 3.0, 5.0, 7.0], np.float32)
    normalize.update(values)
    std = values.std(ddof=1)
    out = normalize.transform(np.array([1.0, 100.0, -100.0], np.float32)).numpy()
    np.testing.assert_allclose(out, [1.0 / std, 2.0, -2.0], rtol=1e-5)
    identity = StreamingNormalize((), center=False, scale=False)
    identity.update(values)
    np.testing.assert_array_equal(identity.transform(values).numpy(), values)


def test_streaming_normalize_is_identity_before_two_values_and_resets():
    normalize = StreamingNormalize((2,), center=False, scale=True)
    values = np.array([[4.0, -2.0]], np.float32)
    np.testing.assert_array_equal(normalize.transform(values).numpy(), values)
    normalize.update(values)
    np.testing.assert_allclose(normalize.transform(values).numpy(), values, rtol=1e-6)
    normalize.update(values * 3)
    normalize.reset()
    assert int(normalize.count) == 0
    np.testing.assert_array_equal(normalize.mean.numpy(), np.zeros(2))


def test_streaming_normalize_rejects_non_finite_values():
    normalize = StreamingNormalize((), center=True, scale=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-finite"):
        normalize.update(np.array([1.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="clip"):
        StreamingNormalize((), clip=0.0)


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    batches=st.lists(st.lists(st.floats(-1e3, 1e3, width=32), max_size=8), min_size=1,
                     max_size=6))
def test_streaming_statistics_match_numpy_for_any_batches(batches):
    normalize = StreamingNormalize((), center=True, scale=True)
    mean = StreamingMean(())
    for batch in batches:
        values = np.array(batch, np.float32)
        normalize.update(values)
        mean.submit(values)
    values = np.array([x for batch in batches for x in batch], np.float64)
    assert int(normalize.count) == len(values) == int(mean.count)
    if len(values):
        np.testing.assert_allclose(normalize.mean.numpy(), values.mean(), rtol=1e-5,
                                   atol=1e-3)
        np.testing.assert_allclose(mean.value.numpy(), values.mean(), rtol=1e-4, atol=1e-3)
    if len(values) > 1:
        np.testing.assert_allclose(normalize.std.numpy(), values.std(ddof=1), rtol=1e-4,
                                   atol=1e-3)


def test_normalize_with_a_mask_leaves_the_other_elements_unchanged():
    normalize = StreamingNormalize((3,), clip=1.0, mask=[True, False, True])
    values = np.array([[1.0, 0.0, 10.0], [3.0, 1.0, 20.0], [5.0, 1.0, 90.0]], np.float32)
    normalize.update(values)
    result = normalize.transform(values).numpy()
    np.testing.assert_array_equal(result[:, 1], values[:, 1])
    np.testing.assert_allclose(result[:, 0], [-1.0, 0.0, 1.0], rtol=1e-5)
    std = np.std(values[:, 2], ddof=1)  # 43.6: the last value is clipped.
    np.testing.assert_allclose(result[:, 2], [-30.0 / std, -20.0 / std, 1.0], rtol=1e-5)
    with pytest.raises(ValueError, match=r"mask of shape \(2,\), expected \(3,\)"):
        StreamingNormalize((3,), mask=[True, False])


@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False)])
def test_inverse_undoes_transform_inside_the_clipping_range(center, scale):
    """`inverse(transform(x)) == x` for the parts `transform` applies; masked-out elements
    pass unchanged both ways; a clipped value maps back to the clipping bound."""
    normalize = StreamingNormalize((2,), center=center, scale=scale, clip=3.0,
                                   mask=[True, False])
    values = np.array([[1.0, 5.0], [4.0, 6.0], [10.0, 7.0]], np.float32)
    normalize.update(values)
    sample = np.array([[2.0, -1.0], [8.0, 50.0]], np.float32)
    np.testing.assert_allclose(
        normalize.inverse(normalize.transform(sample)).numpy(), sample, rtol=1e-5)
    mean = values[:, 0].mean() if center else 0.0
    std = values[:, 0].std(ddof=1) if scale else 1.0
    far = np.array([[mean + 10.0 * std, 0.0]], np.float32)
    np.testing.assert_allclose(normalize.inverse(normalize.transform(far)).numpy(),
                               [[mean + 3.0 * std, 0.0]], rtol=1e-5)

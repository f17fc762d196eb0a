"""`benchmarks.allreduce`'s model: the least-squares line, a ring all-reduce's seconds among
M workers from the two-worker line, and the learners' bound, against hand computations."""

import pytest

from benchmarks import allreduce


def test_the_line_goes_through_points_on_a_line():
    points = {1_000: 0.002 + 1e-9 * 1_000, 1_000_000: 0.002 + 1e-9 * 1_000_000,
              4_000_000: 0.002 + 1e-9 * 4_000_000}
    a, b = allreduce.fit(points)
    assert (a, b) == (pytest.approx(0.002), pytest.approx(1e-9))


def test_a_ring_all_reduce_grows_with_the_workers_from_the_two_worker_line():
    a, b, nbytes = 0.002, 1e-9, 4_000_000
    assert allreduce.allreduce_seconds(1, nbytes, a, b) == 0.0
    assert allreduce.allreduce_seconds(2, nbytes, a, b) == pytest.approx(a + b * nbytes)
    # 2 (M - 1) latencies of a / 2 each, 2 (M - 1) / M of the bytes.
    assert allreduce.allreduce_seconds(8, nbytes, a, b) == pytest.approx(
        7 * a + 14 / 8 * b * nbytes)


def test_the_bound_is_the_learners_or_the_actors():
    entry = {"parameters": 250_000, "update": 0.02, "steps_per_update": 1_000,
             "actor": 5_000}
    a, b = 0.002, 1e-9
    one, bound = allreduce.model(entry, 1, 100, a, b)
    assert (one, bound) == (pytest.approx(1_000 / 0.02), "learners")
    two, _ = allreduce.model(entry, 2, 100, a, b)
    assert two == pytest.approx(2 * 1_000 / (0.02 + a + b * 1_000_000))
    assert allreduce.model(entry, 2, 1, a, b) == (pytest.approx(10_000), "actors")

"""The replay memory's parts apart, as a distributed learner would use them: actors run
n-step accumulators whose writer sends the transitions away, a learner writes them into its
storage and gives them priorities; against the NumPy reference of test_replay.py."""

import numpy as np
import tensorflow as tf

from batchrl.memories.n_step import NStepAccumulator
from batchrl.memories.observation_storage import ObservationStorage
from batchrl.memories.samplers import PrioritizedSampler, annealed_beta
from batchrl.memories.storage import FIELDS, TransitionStorage, cast_fields
from tests.memories.test_replay import ACTION, OBSERV, NumpyReplay, _random_step


class Actor:
    """An accumulator for `agents` agents whose writer keeps the emitted transitions (as
    NumPy arrays) in `outbox`, for a learner elsewhere."""

    def __init__(self, agents, n_step, discount):
        self.accumulator = NStepAccumulator(OBSERV, ACTION, agents, n_step, discount)
        self.outbox = []

    def write(self, transitions, emit):
        emit = np.ones(transitions["reward"].shape[0], bool) if emit is None else \
            np.asarray(emit)
        self.outbox.append({key: np.asarray(value)[emit] for key, value in transitions.items()})
        return tf.constant(int(emit.sum()), tf.int32)


def test_actors_accumulate_and_a_learner_stores_what_they_send():
    """Two actors of 2 agents each (the reference's agents 0-1 and 2-3), the learner writing
    each actor's outbox in turn: the learner's storage is the reference's ring, with n-step
    returns, terminations, truncations and cut episodes."""
    rng = np.random.default_rng(7)
    capacity, n_step, discount = 17, 3, 0.9
    actors = [Actor(2, n_step, discount), Actor(2, n_step, discount)]
    storage = TransitionStorage(ObservationStorage(*OBSERV), ACTION, capacity)
    sampler = PrioritizedSampler(capacity + 1, {"alpha": 0.5, "beta": 0.4, "epsilon": 0.01},
                                 seed=0)
    reference = NumpyReplay(capacity, 4, n_step, discount)
    received = 0
    for t in range(40):
        for number, actor in enumerate(actors):
            agents = rng.permutation(2)[:rng.integers(1, 3)]
            step = _random_step(rng, agents)
            sent = actor.accumulator.add(**step, write=actor.write)
            reference.add(agents + 2 * number, step["observ"], step["action"],
                          step["reward"], step["terminated"], step["truncated"],
                          step["nextob"])
            if t % 9 == 8:
                sent += actor.accumulator.flush(np.array([1], np.int32), actor.write)
                reference.flush([1 + 2 * number])
            assert int(sent) == sum(len(batch["reward"]) for batch in actor.outbox)
            for batch in actor.outbox:
                count, rows, keep = storage.write(cast_fields(batch, storage.specs))
                sampler.added(rows, keep)
                received += int(count)
            actor.outbox.clear()
    assert received > capacity  # The ring wrapped around.
    assert (int(storage.size), int(storage.position)) == (reference.size, reference.position)
    for key in FIELDS:
        np.testing.assert_allclose(storage.fields[key].numpy()[:capacity],
                                   np.stack(reference.rows[key]), rtol=1e-5, atol=1e-6)
    # Every row written got the first largest priority, 1; the spare row none.
    np.testing.assert_array_equal(sampler.priorities.get(np.arange(capacity + 1)),
                                  [1.0] * capacity + [0.0])


def test_the_learners_sampler_gives_new_rows_the_largest_priority_so_far():
    storage = TransitionStorage(ObservationStorage(*OBSERV), ACTION, 4)
    sampler = PrioritizedSampler(5, {"alpha": 0.5, "beta": 0.4, "epsilon": 0.01}, seed=1)
    ones = {key: np.ones((2,) + shape, np.float32) for key, (shape, _) in storage.specs.items()}
    _, rows, keep = storage.write(ones)
    sampler.added(rows, keep)
    total = sampler.update(np.array([0, 1], np.int32), np.array([3.99, -0.24], np.float32))
    np.testing.assert_allclose(total, 2.0 + 0.5, rtol=1e-6)  # sqrt(4.0) + sqrt(0.25).
    np.testing.assert_allclose(sampler.max_priority.numpy(), 2.0, rtol=1e-6)
    _, rows, keep = storage.write(ones)
    sampler.added(rows, keep)
    np.testing.assert_allclose(sampler.priorities.get(np.arange(5)), [2, 0.5, 2, 2, 0],
                               rtol=1e-6)
    index, weight = sampler.sample(4, storage.size)
    assert set(index.numpy()) <= {0, 1, 2, 3}
    # w = (N P(i))^-beta / max: P = p / 6.5, N = 4.
    expected = (4 * np.array([2, 0.5, 2, 2])[index.numpy()] / 6.5) ** -0.4
    np.testing.assert_allclose(weight, expected / expected.max(), rtol=1e-5)


def test_beta_anneals_linearly_to_one_over_the_steps():
    values = [float(annealed_beta(0.4, step, 100)) for step in (0, 25, 50, 100, 250)]
    np.testing.assert_allclose(values, [0.4, 0.55, 0.7, 1.0, 1.0], rtol=1e-6)

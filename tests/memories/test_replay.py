"""The in-graph replay memory against NumPy references: ring buffer, n-step returns,
uniform and prioritized sampling, XLA and checkpoints."""

import re

import numpy as np
import pytest
import tensorflow as tf

from batchrl.memories.replay import FIELDS, ReplayMemory

OBSERV = ((3,), tf.float32)
ACTION = ((2,), tf.float32)
# Chi-square critical values at p = 0.001 by degrees of freedom (standard tables).
CHI2_CRITICAL = {4: 18.467, 7: 24.322, 9: 27.877}


class NumpyReplay:
    """A straightforward reference: a ring of capacity rows and per-agent lists of steps."""

    def __init__(self, capacity, num_agents, n_step, discount):
        self.capacity, self.n_step, self.discount = capacity, n_step, discount
        self.rows = {key: [None] * capacity for key in FIELDS}
        self.position, self.size = 0, 0
        self.pending = [[] for _ in range(num_agents)]
        self.last_nextob = [None] * num_agents

    def write(self, **transition):
        for key in FIELDS:
            self.rows[key][self.position] = np.asarray(transition[key])
        self.position = (self.position + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def add(self, agents, observ, action, reward, terminated, truncated, nextob):
        for i, agent in enumerate(agents):
            pending = self.pending[agent]
            pending.append((observ[i], action[i], reward[i]))
            self.last_nextob[agent] = nextob[i]
            done = terminated[i] or truncated[i]
            leaving = range(len(pending)) if done else [0] if len(pending) == self.n_step \
                else []
            for start in leaving:
                self._leave(pending[start:], terminated[i], nextob[i])
            if done:
                pending.clear()
            elif len(pending) == self.n_step:
                pending.pop(0)

    def flush(self, agents):
        """Ends the agents' episodes as truncated after their last step (by index)."""
        for agent in sorted(agents):
            pending = self.pending[agent]
            for start in range(len(pending)):
                self._leave(pending[start:], False, self.last_nextob[agent])
            pending.clear()

    def _leave(self, steps, terminated, nextob):
        ret = sum(self.discount ** k * step[2] for k, step in enumerate(steps))
        discount = 0.0 if terminated else self.discount ** len(steps)
        self.write(observ=steps[0][0], action=steps[0][1], reward=ret, discount=discount,
                   nextob=nextob)

    def assert_matches(self, memory):
        assert int(memory.size) == self.size
        assert int(memory.position) == self.position
        if not self.size:
            return
        for key in FIELDS:
            stored = memory.storage[key].numpy()[:self.size]
            expected = np.stack(self.rows[key][:self.size])
            np.testing.assert_allclose(stored, expected, rtol=1e-5, atol=1e-6, err_msg=key)


def _random_step(rng, agents, shape=(3,)):
    n = len(agents)
    return dict(
        agent_indices=np.asarray(agents, np.int32),
        observ=rng.integers(0, 256, (n,) + shape).astype(np.float32),
        action=rng.normal(size=(n, 2)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32),
        terminated=rng.random(n) < 0.1, truncated=rng.random(n) < 0.1,
        nextob=rng.integers(0, 256, (n,) + shape).astype(np.float32))


def _reference_add(reference, step):
    reference.add(step["agent_indices"], step["observ"], step["action"], step["reward"],
                  step["terminated"], step["truncated"], step["nextob"])


@pytest.mark.parametrize("n_step", [1, 3, 4])
def test_n_step_returns_match_numpy(n_step):
    rng = np.random.default_rng(n_step)
    capacity, num_agents, discount = 23, 5, 0.9
    memory = ReplayMemory(OBSERV, ACTION, capacity, num_agents, n_step, discount)
    reference = NumpyReplay(capacity, num_agents, n_step, discount)
    total = 0
    for t in range(80):
        agents = rng.permutation(num_agents)[:rng.integers(1, num_agents + 1)]
        step = _random_step(rng, agents)
        total += int(memory.add(**step))
        _reference_add(reference, step)
        if t % 17 == 16:
            cut = rng.choice(num_agents, 2, replace=False).astype(np.int32)
            count = sum(len(reference.pending[agent]) for agent in cut)
            assert int(memory.reset_agents(cut)) == count
            reference.flush(cut)
        reference.assert_matches(memory)
    assert total > capacity  # The ring wrapped around, windows included.


def test_n_step_hand_computed_episode():
    memory = ReplayMemory(OBSERV, ACTION, 10, 1, n_step=3, discount=0.5)
    ones = np.ones((1, 3), np.float32)
    no = np.array([False])
    counts = [int(memory.add([0], ones * t, np.zeros((1, 2)), [float(t + 1)], no, no,
                             ones * (t + 1))) for t in range(4)]
    counts.append(int(memory.add([0], ones * 4, np.zeros((1, 2)), [5.0], [True], no,
                                 ones * 5)))
    assert counts == [0, 0, 1, 1, 3]
    np.testing.assert_allclose(memory.storage["reward"].numpy()[:5],
                               [1 + 1 + 0.75, 2 + 1.5 + 1, 3 + 2 + 1.25, 4 + 2.5, 5])
    np.testing.assert_allclose(memory.storage["discount"].numpy()[:5],
                               [0.125, 0.125, 0, 0, 0])
    np.testing.assert_allclose(memory.storage["observ"].numpy()[:5, 0], [0, 1, 2, 3, 4])
    np.testing.assert_allclose(memory.storage["nextob"].numpy()[:5, 0], [3, 4, 5, 5, 5])


def test_reset_agents_stores_the_waiting_steps_as_truncated():
    """n_step=3, discount 0.5: agent 0 takes 2 steps, agent 1 takes 3 (its first leaves
    with the full 3-step return); the reset of both (given in either order) stores the
    waiting ones with their returns to the last step, discount 0.5^k and the last step's
    next observation."""
    memory = ReplayMemory(OBSERV, ACTION, 10, 2, n_step=3, discount=0.5)
    no = np.array([False])
    rewards = {0: [1.0, 2.0], 1: [4.0, 8.0, 16.0]}
    for agent, values in rewards.items():
        for t, reward in enumerate(values):
            observ = np.full((1, 3), 10 * agent + t, np.float32)
            memory.add([agent], observ, observ[:, :2], [reward], no, no, observ + 0.5)
    assert int(memory.size) == 1  # Agent 1's first step.
    assert int(memory.reset_agents(np.array([1, 0], np.int32))) == 4
    assert int(memory.reset_agents(np.array([0, 1], np.int32))) == 0  # Windows empty.
    storage = {key: memory.storage[key].numpy()[:5] for key in FIELDS}
    # Agent 1's first step, then the waiting ones by agent index: 0's two, 1's two.
    np.testing.assert_allclose(storage["observ"][:, 0], [10, 0, 1, 11, 12])
    np.testing.assert_allclose(storage["action"][:, 0], [10, 0, 1, 11, 12])
    np.testing.assert_allclose(storage["reward"], [
        4 + 0.5 * 8 + 0.25 * 16, 1 + 0.5 * 2, 2, 8 + 0.5 * 16, 16])
    np.testing.assert_allclose(storage["discount"], [0.125, 0.25, 0.5, 0.25, 0.5])
    # Each bootstraps from the observation after its agent's last step.
    np.testing.assert_allclose(storage["nextob"][:, 0], [12.5, 1.5, 1.5, 12.5, 12.5])


def test_ring_wraparound_uint8_and_size_saturation():
    rng = np.random.default_rng(0)
    capacity = 7
    memory = ReplayMemory(((2, 2), tf.uint8), ((), tf.int32), capacity, 1)
    reference = NumpyReplay(capacity, 1, 1, 0.99)
    sizes = []
    for n in [3, 5, 1, 9, 2, 7, 4]:
        transitions = dict(
            observ=rng.integers(0, 256, (n, 2, 2)).astype(np.float32),
            action=rng.integers(0, 5, n), reward=rng.normal(size=n).astype(np.float32),
            discount=rng.random(n).astype(np.float32),
            nextob=rng.integers(0, 256, (n, 2, 2)).astype(np.float32))
        assert int(memory.insert(transitions)) == n
        for i in range(n):
            reference.write(**{key: value[i] for key, value in transitions.items()})
        reference.assert_matches(memory)
        sizes.append(int(memory.size))
    assert sizes == [3, 7, 7, 7, 7, 7, 7]
    assert memory.storage["observ"].dtype == tf.uint8
    batch = memory.sample(5)
    assert batch["observ"].dtype == tf.uint8 and batch["nextob"].dtype == tf.uint8
    assert batch["action"].dtype == tf.int32
    rows = np.stack(reference.rows["observ"])
    np.testing.assert_array_equal(batch["observ"].numpy(), rows[batch["index"].numpy()])


def test_bytes_per_transition():
    memory = ReplayMemory(((17,), tf.float32), ((6,), tf.float32), 1000, 4)
    assert memory.bytes_per_transition == 2 * 17 * 4 + 6 * 4 + 4 + 4
    image = ReplayMemory(((84, 84, 4), tf.uint8), ((), tf.int64), 1000, 4,
                         prioritized={"alpha": 0.5})
    tree_share = -(-2 * 1024 * 4 // 1000)  # 2 P float32 entries over 1000 transitions.
    assert image.bytes_per_transition == 2 * 84 * 84 * 4 + 8 + 4 + 4 + tree_share


def _chi_square(counts, probabilities):
    expected = counts.sum() * np.asarray(probabilities)
    return float(np.sum((counts - expected) ** 2 / expected))


def _fill(memory, count):
    """Inserts `count` transitions whose reward is their insertion number."""
    memory.insert(dict(observ=np.zeros((count, 3)), action=np.zeros((count, 2)),
                       reward=np.arange(count, dtype=np.float32), discount=np.ones(count),
                       nextob=np.zeros((count, 3))))


def test_uniform_sampling_frequencies():
    memory = ReplayMemory(OBSERV, ACTION, 16, 1, seed=3)
    _fill(memory, 10)  # Only rows [0, 10) are stored.
    sample = tf.function(lambda: memory.sample(500))
    index = np.concatenate([sample()["index"].numpy() for _ in range(20)])
    counts = np.bincount(index, minlength=16)
    assert counts[10:].sum() == 0
    assert _chi_square(counts[:10], np.full(10, 0.1)) < CHI2_CRITICAL[9]
    batch = sample()
    np.testing.assert_array_equal(batch["reward"], batch["index"].numpy().astype(np.float32))
    np.testing.assert_array_equal(batch["weight"], np.ones(500))
    # A counterfactual check that the test can fail: a skewed histogram is rejected.
    assert _chi_square(counts[:10], np.r_[0.2, np.full(9, 0.8 / 9)]) > CHI2_CRITICAL[9]


def _numpy_weights(priorities, index, size, beta):
    probability = priorities[index] / priorities.sum()
    weight = (size * probability) ** -beta
    return weight / weight.max()


def test_prioritized_frequencies_weights_and_updates():
    config = {"alpha": 0.7, "beta": 0.5, "epsilon": 0.01}
    memory = ReplayMemory(OBSERV, ACTION, 8, 1, prioritized=config, seed=1)
    _fill(memory, 8)
    np.testing.assert_array_equal(memory.priorities.get(np.arange(8)), np.ones(8))
    td_error = np.array([0.1, -2.0, 0.5, 1.0, -0.3, 3.0, 0.0, 1.5], np.float32)
    memory.update_priorities(np.arange(8, dtype=np.int32), td_error)
    priorities = (np.abs(td_error) + 0.01) ** 0.7
    np.testing.assert_allclose(memory.priorities.get(np.arange(8)), priorities, rtol=1e-6)
    sample = tf.function(lambda beta: memory.sample(64, beta))
    batches = [sample(tf.constant(0.5)) for _ in range(150)]
    counts = np.bincount(np.concatenate([b["index"].numpy() for b in batches]), minlength=8)
    assert _chi_square(counts, priorities / priorities.sum()) < CHI2_CRITICAL[7]
    assert _chi_square(counts, np.full(8, 1 / 8)) > CHI2_CRITICAL[7]
    for batch in batches[:5]:
        index = batch["index"].numpy()
        np.testing.assert_array_equal(batch["reward"], index.astype(np.float32))
        np.testing.assert_allclose(batch["weight"], _numpy_weights(priorities, index, 8, 0.5),
                                   rtol=1e-5)
    # beta overrides the configured one.
    batch = memory.sample(64, beta=1.0)
    np.testing.assert_allclose(
        batch["weight"], _numpy_weights(priorities, batch["index"].numpy(), 8, 1.0), rtol=1e-5)
    # New priorities change the frequencies.
    changed = np.array([2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    memory.update_priorities(np.arange(8, dtype=np.int32), changed)
    new_priorities = (np.abs(changed) + 0.01) ** 0.7
    counts = np.bincount(np.concatenate([sample(tf.constant(0.5))["index"].numpy()
                                         for _ in range(150)]), minlength=8)
    assert _chi_square(counts, new_priorities / new_priorities.sum()) < CHI2_CRITICAL[7]
    assert counts[0] > 0.8 * counts.sum()  # P(0) = 0.854.
    # New transitions get the largest priority seen so far.
    _fill(memory, 2)
    np.testing.assert_allclose(memory.priorities.get([0, 1]), [priorities.max()] * 2,
                               rtol=1e-6)


def test_prioritized_stratified_partially_filled():
    memory = ReplayMemory(OBSERV, ACTION, 10, 1, prioritized={"beta": 1.0}, seed=0)
    _fill(memory, 5)
    batch = memory.sample(1000)
    counts = np.bincount(batch["index"].numpy(), minlength=10)
    # Stratified over equal priorities: each stored row gets exactly its share.
    np.testing.assert_array_equal(counts, [200] * 5 + [0] * 5)
    np.testing.assert_allclose(batch["weight"], np.ones(1000), rtol=1e-6)


@pytest.mark.parametrize("kwargs, culprit", [
    ({"capacity": 0}, "capacity"), ({"n_step": 0}, "n_step"), ({"discount": 1.5}, "discount"),
    ({"discount": -0.1}, "discount"), ({"num_agents": 0}, "num_agents"),
    ({"prioritized": {"alpha": 0.6, "omega": 1}}, "omega"),
    ({"prioritized": {"beta": 2.0}}, "beta"), ({"prioritized": {"epsilon": 0}}, "epsilon")])
def test_bad_constructor_arguments_raise(kwargs, culprit):
    arguments = {"capacity": 10, "num_agents": 2, **kwargs}
    with pytest.raises(ValueError, match=culprit):
        ReplayMemory(OBSERV, ACTION, **arguments)


def test_insert_missing_key_raises():
    memory = ReplayMemory(OBSERV, ACTION, 10, 1)
    with pytest.raises(ValueError, match="discount"):
        memory.insert({"observ": np.zeros((1, 3)), "action": np.zeros((1, 2)),
                       "reward": np.zeros(1), "nextob": np.zeros((1, 3))})


def _memory_state(memory):
    return [variable.numpy() for variable in sorted(memory.variables, key=lambda v: v.name)]


def _assert_same_state(first, second, rtol=0.0):
    """The variables are equal (floats within `rtol`: XLA's `pow` may differ by an ulp)."""
    for a, b in zip(_memory_state(first), _memory_state(second), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol)


@pytest.mark.parametrize("n_step, prioritized", [(1, None), (3, {"alpha": 0.6})])
def test_jit_matches_eager(n_step, prioritized):
    rng = np.random.default_rng(5)
    memories = [ReplayMemory(OBSERV, ACTION, 13, 4, n_step, 0.9, prioritized, seed=2)
                for _ in range(2)]
    eager, compiled = memories
    add = tf.function(compiled.add, jit_compile=True)
    insert = tf.function(compiled.insert, jit_compile=True)
    sample = tf.function(lambda: compiled.sample(8), jit_compile=True)
    update = tf.function(compiled.update_priorities, jit_compile=True)
    # The agents as `begin_episodes` gets them: a number known only when run.
    reset = tf.function(lambda cut: compiled.reset_agents(
        tf.cast(tf.reshape(tf.where(cut), [-1]), tf.int32)), jit_compile=True)
    for t in range(8):
        step = _random_step(rng, rng.permutation(4)[:3])
        assert int(eager.add(**step)) == int(add(**{k: tf.constant(v) for k, v in step.items()}))
        if t % 3 == 2:
            cut = rng.random(4) < 0.5
            assert int(eager.reset_agents(np.flatnonzero(cut).astype(np.int32))) == \
                int(reset(tf.constant(cut)))
        if t % 4 == 3:
            transitions = {key: value for key, value in step.items() if key in FIELDS}
            transitions["discount"] = rng.random(3).astype(np.float32)
            transitions["reward"] = step["reward"]
            eager.insert(transitions)
            insert({key: tf.constant(value) for key, value in transitions.items()})
        if int(eager.size):
            expected, batch = eager.sample(8), sample()
            for key in expected:
                np.testing.assert_allclose(expected[key], batch[key], rtol=1e-6, err_msg=key)
            td_error = rng.normal(size=8).astype(np.float32)
            eager.update_priorities(expected["index"], td_error)
            update(batch["index"], tf.constant(td_error))
        _assert_same_state(eager, compiled, rtol=1e-6)


def test_jit_inside_while_loop_matches_eager():
    rng = np.random.default_rng(6)
    steps, agents = 10, 3
    data = _random_step(rng, np.arange(steps * agents) % agents)
    data = {key: value.reshape((steps, agents) + value.shape[1:]) for key, value in
            data.items()}
    td_errors = rng.normal(size=(steps, 4)).astype(np.float32)
    memories = [ReplayMemory(OBSERV, ACTION, 11, agents, 3, 0.9, {"alpha": 0.5}, seed=4)
                for _ in range(2)]
    eager, compiled = memories

    def one_step(memory, t, step_data, td_error):
        count = memory.add(**{key: value[t] for key, value in step_data.items()})
        batch = memory.sample(4)
        with tf.control_dependencies([count]):
            memory.update_priorities(batch["index"], td_error[t])
        return count, batch["reward"]

    @tf.function(jit_compile=True)
    def run(step_data, td_error):
        def body(t, total, rewards):
            count, reward = one_step(compiled, t, step_data, td_error)
            return t + 1, total + count, rewards.write(t, reward)
        rewards = tf.TensorArray(tf.float32, size=steps)
        _, total, rewards = tf.while_loop(lambda t, *_: t < steps, body,
                                          (tf.constant(0), tf.constant(0), rewards))
        return total, rewards.stack()

    # One step first, so that sampling never meets an empty memory (3 agents, 1 done).
    data["terminated"][0] = [True, False, False]
    total, rewards = run({key: tf.constant(value) for key, value in data.items()},
                         tf.constant(td_errors))
    expected = [one_step(eager, t, data, td_errors) for t in range(steps)]
    assert int(total) == sum(int(count) for count, _ in expected)
    np.testing.assert_allclose(rewards, np.stack([reward for _, reward in expected]),
                               rtol=1e-6)
    _assert_same_state(eager, compiled, rtol=1e-6)


def test_checkpoint_round_trip(tmp_path):
    rng = np.random.default_rng(7)
    arguments = dict(observ_spec=((3,), tf.uint8), action_spec=ACTION, capacity=9,
                     num_agents=3, n_step=3, discount=0.9, prioritized={"alpha": 0.6}, seed=5)
    memory = ReplayMemory(**arguments)
    for _ in range(8):
        memory.add(**_random_step(rng, rng.permutation(3)[:2]))
    batch = memory.sample(5)
    memory.update_priorities(batch["index"], rng.normal(size=5).astype(np.float32))
    path = tf.train.Checkpoint(memory=memory).write(str(tmp_path / "ckpt"))
    restored = ReplayMemory(**{**arguments, "seed": 123})
    tf.train.Checkpoint(memory=restored).read(path).assert_consumed()
    _assert_same_state(memory, restored)
    expected, batch = memory.sample(6), restored.sample(6)
    for key in expected:
        np.testing.assert_array_equal(expected[key], batch[key], err_msg=key)
    step = _random_step(rng, [0, 1, 2])  # The staging windows were restored too.
    assert int(memory.add(**step)) == int(restored.add(**step))
    _assert_same_state(memory, restored)


def _copies(hlo, shape):
    """The number of whole-buffer copies of `shape` (e.g. 'f32[1001,3]') in optimized HLO."""
    return len(re.findall(re.escape(shape) + r"\{[0-9,]*\} copy\(", hlo))


def _loop_body(hlo):
    """The text of the while loop's body computation in optimized HLO."""
    return re.search(r"^%\S*while_body.*?^}", hlo, re.M | re.S).group(0)


@pytest.mark.parametrize("prioritized", [None, {"alpha": 0.6}])
def test_xla_add_then_updates_do_not_copy_the_memory(prioritized):
    # The off-policy step under XLA: add, then (in a tf.cond) a loop of sample and
    # update_priorities. A copy of the storage would cost 170 MB a step at capacity 1e6, a
    # copy of the sum tree 8 MB an update (the importance weights read it too).
    memory = ReplayMemory(OBSERV, ACTION, 100, 2, n_step=1, prioritized=prioritized)
    _fill(memory, 10)
    step = _random_step(np.random.default_rng(0), [0, 1])
    step = {key: tf.constant(value) for key, value in step.items()}

    def updates(count):
        def body(i, total):
            batch = memory.sample(8)
            done = memory.update_priorities(batch["index"], batch["reward"])
            values = [tf.reduce_sum(tf.cast(batch[key], tf.float32))
                      for key in FIELDS + ("weight",)]
            return i + 1, total + tf.add_n(values) + done
        return tf.while_loop(lambda i, _: i < count, body, (0, 0.0))[1]

    @tf.function(jit_compile=True)
    def add_then_update(step, train):
        count = memory.add(**step)
        with tf.control_dependencies([count]):
            return count, tf.cond(train, lambda: updates(3), lambda: tf.constant(0.0))

    hlo = add_then_update.experimental_get_compiler_ir(step, tf.constant(True))(
        stage="optimized_hlo")
    for shape in ("f32[101,3]", "f32[101,2]", "f32[101]"):
        assert _copies(hlo, shape) == 0, shape
    if prioritized:  # (The tf.cond's branch without updates passes the tree on as a copy.)
        assert _copies(_loop_body(hlo), f"f32[{memory.priorities.tree.shape[0]}]") == 0
    count, _ = add_then_update(step, tf.constant(True))
    assert int(count) == 2 and int(memory.size) == 12
    np.testing.assert_array_equal(memory.storage["observ"].numpy()[10:12], step["observ"])

"""The replay memory that keeps each frame of stacked observations once
(`batchrl.memories.frame_storage`), against the NumPy replay of test_replay and a NumPy
model of the frame ring: its live transitions are the newest of the reference, their frames
intact after the ring wrapped, each frame stored once within the window (also when a small
palette of frames recurs across episodes and laps), and sampling draws live transitions
only."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl.memories.frame_storage import FrameStackStorage
from batchrl.memories.replay import FIELDS, ReplayMemory
from tests.memories.test_replay import NumpyReplay

K, SIDE = 4, 5
ACTION = ((), tf.int32)


class Episodes:
    """Agents whose observations stack their last K frames, a new episode starting with its
    first frame repeated K times, as EnvPool's Atari stacks do. The frames are random ones,
    or with `palette` > 0 drawn from that many distinct nonzero frames, so that equal
    frames recur within and across episodes and the ring's laps."""

    def __init__(self, rng, agents, axis, channels, palette=0):
        self.rng, self.axis, self.channels = rng, axis, channels
        self.shape = (channels, SIDE, SIDE) if axis == 0 else (SIDE, SIDE, channels)
        self.palette = None
        if palette:
            self.palette = rng.integers(1, 256, (palette,) + self.shape, dtype=np.uint8)
            assert len({frame.tobytes() for frame in self.palette}) == palette
        self.history = [self._first() for _ in range(agents)]

    def _frame(self):
        if self.palette is not None:
            return self.palette[self.rng.integers(len(self.palette))]
        return self.rng.integers(0, 256, self.shape, dtype=np.uint8)

    def _first(self):
        return [self._frame()] * K

    def stack(self, agent):
        return np.concatenate(self.history[agent][-K:], self.axis)

    def step(self, agents):
        """One step of `agents`: a dict of `ReplayMemory.add`'s arguments."""
        observ = np.stack([self.stack(agent) for agent in agents])
        for agent in agents:
            self.history[agent].append(self._frame())
        nextob = np.stack([self.stack(agent) for agent in agents])
        n = len(agents)
        terminated, truncated = self.rng.random(n) < 0.05, self.rng.random(n) < 0.05
        for agent, done in zip(agents, terminated | truncated, strict=True):
            if done:
                self.history[agent] = self._first()
        return dict(agent_indices=np.asarray(agents, np.int32), observ=observ,
                    action=self.rng.integers(0, 6, n).astype(np.int32),
                    reward=self.rng.normal(size=n).astype(np.float32),
                    terminated=terminated, truncated=truncated, nextob=nextob)

    def restart(self, agents):
        for agent in agents:
            self.history[agent] = self._first()


class LoggedReplay(NumpyReplay):
    """test_replay's NumPy replay that also keeps the transitions of each write: `begin`
    opens a write (one `ReplayMemory.add` or `reset_agents`), `writes` lists them."""

    def __init__(self, *args):
        super().__init__(*args)
        self.writes = []

    def begin(self):
        self.writes.append([])

    def write(self, **transition):
        super().write(**transition)
        self.writes[-1].append(transition)


class FrameRing:
    """A NumPy model of the frame ring's rule (frame_storage's docstring), for the writes of
    a `LoggedReplay`: each frame of a write's stacks (all `observ` stacks' frames, oldest
    first, then all `nextob` stacks') equal to the frame of one of the last `window` slots
    may take any such slot; another equal to an earlier frame of the write takes its slot;
    any other takes the next new slot from `position` on. The write's transitions take the
    slots from `position` on; it advances past its new frames or its transitions, whichever
    are more, and takes the slots `2 window` ahead that it advances over out of sampling."""

    def __init__(self, capacity, window, axis, channels):
        self.window, self.axis, self.channels = window, axis, channels
        self.slots = capacity + 2 * window
        self.frames = [None] * self.slots  # Each slot's frame (uint8 array), None: none yet.
        self.live = np.zeros(self.slots, bool)
        self.allowed = [None] * self.slots  # Each row's 2 K sets of slots its frames may take.
        self.position = 0

    def _split(self, stack):
        c = self.channels
        return [stack[i * c:(i + 1) * c] if self.axis == 0 else stack[..., i * c:(i + 1) * c]
                for i in range(K)]

    def write(self, transitions):
        p, window, slots = self.position, self.window, self.slots
        near = [(p - window + j) % slots for j in range(window)]
        candidates = [frame for key in ("observ", "nextob") for transition in transitions
                      for frame in self._split(transition[key])]
        in_window = {}  # The bytes of the window's frames -> their slots.
        for slot in near:
            if self.frames[slot] is not None:
                in_window.setdefault(self.frames[slot].tobytes(), set()).add(slot)
        placed, allowed = {}, []  # placed: a new frame's bytes -> its slot.
        for frame in candidates:
            shared = in_window.get(frame.tobytes())
            if not shared:
                shared = {placed.setdefault(frame.tobytes(), (p + len(placed)) % slots)}
            allowed.append(shared)
        for frame in candidates:
            if frame.tobytes() in placed:
                self.frames[placed[frame.tobytes()]] = frame
        m, advance = len(transitions), max(len(placed), len(transitions))
        assert advance <= window  # The memory would raise.
        self.live[(p + 2 * window + np.arange(advance)) % slots] = False
        for i in range(m):
            self.live[(p + i) % slots] = True
            self.allowed[(p + i) % slots] = allowed[i * K:(i + 1) * K] + \
                allowed[(m + i) * K:(m + i + 1) * K]
        self.position = (p + advance) % slots


def _assert_frames_kept_once(memory, reference):
    """The memory's ring is the `FrameRing` model's after the reference's writes: the same
    slots hold a frame (the same one), the same slots are live, and each frame of a live
    transition is in a slot the model allows it (one frame a slot within the window)."""
    window = memory.frame_stack["window"]
    model = FrameRing(memory.capacity, window, memory.frame_stack["axis"],
                      memory.observ_spec[0][memory.frame_stack["axis"]] // K)
    for transitions in reference.writes:
        model.write(transitions)
    assert int(memory.position) == model.position
    fields = {key: value.numpy()[:model.slots] for key, value in memory.storage.items()}
    occupied = [slot for slot, frame in enumerate(model.frames) if frame is not None]
    assert np.flatnonzero(fields["fingerprint"] != -1).tolist() == occupied
    for slot in occupied:
        np.testing.assert_array_equal(fields["frames"][slot], model.frames[slot],
                                      err_msg=f"slot {slot}")
    np.testing.assert_array_equal(fields["live"], model.live)
    for row in np.flatnonzero(model.live):
        frame_slots = np.concatenate([fields["observ"][row], fields["nextob"][row]])
        for slot, allowed in zip(frame_slots, model.allowed[row], strict=True):
            assert slot in allowed, (row, slot, allowed)
    return model


def _live_in_order(memory):
    """The live slots of a frame-stack memory, oldest first."""
    ring = memory._ring
    slots = (int(memory.position) + 2 * memory.frame_stack["window"] +
             np.arange(ring.slots - 2 * memory.frame_stack["window"])) % ring.slots
    return slots[memory.storage["live"].numpy()[slots]]


def _assert_newest(memory, reference):
    """The memory's live transitions are the reference's newest, in order."""
    slots = _live_in_order(memory)
    assert len(slots) == int(memory.size)
    stored = {key: value.numpy() for key, value in memory._ring.gather(slots).items()}
    rows = (reference.position - len(slots) + np.arange(len(slots))) % reference.capacity
    for key in FIELDS:
        expected = np.stack([reference.rows[key][row] for row in rows])
        np.testing.assert_allclose(stored[key], expected, rtol=1e-6, atol=1e-6, err_msg=key)
    return stored


def _fill(axis, channels, n_step, steps=150, capacity=60, agents=4, window=48, seed=0,
          prioritized=None, palette=0, check=False):
    """A memory and its `LoggedReplay` after `steps` steps of random agents with resets;
    with `check`, the live transitions are the reference's newest every 10 steps."""
    rng = np.random.default_rng(seed)
    shape = (K * channels, SIDE, SIDE) if axis == 0 else (SIDE, SIDE, K * channels)
    memory = ReplayMemory((shape, tf.uint8), ACTION, capacity, agents, n_step, 0.9,
                          prioritized=prioritized, seed=seed,
                          frame_stack={"frames": K, "axis": axis, "window": window})
    reference = LoggedReplay(capacity, agents, n_step, 0.9)
    episodes = Episodes(rng, agents, axis, channels, palette)
    # One trace for every number of agents: eager steps would take most of the test's time.
    add = tf.function(lambda step: memory.add(**step), reduce_retracing=True)
    reset = tf.function(memory.reset_agents)
    written = 0
    for t in range(steps):
        agents_now = rng.permutation(agents)[:rng.integers(1, agents + 1)]
        step = episodes.step(agents_now)
        written += int(add(step))
        reference.begin()
        reference.add(*step.values())
        if check and t % 10 == 9:
            _assert_newest(memory, reference)
        if t % 23 == 22:
            cut = np.sort(rng.choice(agents, 2, replace=False)).astype(np.int32)
            written += int(reset(cut))
            reference.begin()
            reference.flush(cut)
            episodes.restart(cut)
    assert written > memory._ring.slots  # The ring wrapped around.
    return memory, reference


@pytest.mark.parametrize("axis, channels, n_step, palette, window", [
    (0, 1, 1, 0, 48), (0, 1, 3, 0, 48), (-1, 2, 3, 0, 48),
    (0, 1, 1, 4, 48), (0, 1, 3, 3, 12), (-1, 2, 3, 5, 12)])
def test_live_transitions_are_the_newest_with_their_frames_kept_once(axis, channels, n_step,
                                                                     palette, window):
    memory, reference = _fill(axis, channels, n_step, window=window, palette=palette,
                              check=True)
    assert int(memory.size) >= 40  # Of 60: the slots of new episodes' frames are not rows.
    stored = _assert_newest(memory, reference)
    _assert_frames_kept_once(memory, reference)
    frame_slots = np.concatenate([memory.storage[key].numpy()[_live_in_order(memory)]
                                  for key in ("observ", "nextob")]).ravel()
    frames = np.concatenate([np.stack(np.split(stored[key], K, 1 if axis == 0 else -1))
                             for key in ("observ", "nextob")], 1)
    distinct = {frame.tobytes() for frame in frames.reshape(-1, frames[0, 0].size)}
    if palette:  # Equal frames more than a window apart: one slot each time.
        assert len(distinct) <= palette < len(set(frame_slots))
    else:  # Frames never recur out of their window: one slot a frame.
        assert len(set(frame_slots)) == len(distinct)


def test_equal_fingerprints_of_other_frames_keep_them_apart():
    memory, reference = _fill(0, 1, 3, seed=1, window=60)
    # The fingerprint of a frame is its first pixel: of 256 values, many frames share one.
    memory._ring._fingerprint = lambda flat: tf.cast(flat[:, 0], tf.int64)
    episodes = Episodes(np.random.default_rng(2), 4, 0, 1)
    for _ in range(30):
        step = episodes.step(np.arange(4))
        memory.add(**step)
        reference.begin()
        reference.add(*step.values())
    _assert_newest(memory, reference)


@pytest.mark.parametrize("prioritized", [None, {"alpha": 0.6}])
def test_sampling_draws_live_transitions_only(prioritized):
    memory, reference = _fill(0, 1, 3, prioritized=prioritized)
    live = memory.storage["live"].numpy()
    leaves = memory.priorities.get(tf.range(memory._ring.slots + 1)).numpy()
    np.testing.assert_array_equal(leaves > 0, live)
    if prioritized is None:
        np.testing.assert_array_equal(leaves[live], 1.0)
    drawn = np.concatenate([memory.sample(32)["index"].numpy() for _ in range(20)])
    assert live[drawn].all()
    assert len(set(drawn)) > 0.8 * live.sum()


def test_inserted_transitions_get_their_td_errors_priorities():
    memory, _ = _fill(0, 1, 1, prioritized={"alpha": 0.5, "epsilon": 1e-6})
    episodes = Episodes(np.random.default_rng(3), 6, 0, 1)
    step = episodes.step(np.arange(6))
    transitions = dict(observ=step["observ"], nextob=step["nextob"], action=step["action"],
                       reward=step["reward"], discount=np.full(6, 0.9, np.float32))
    td_error = np.linspace(-2, 3, 6).astype(np.float32)
    position = int(memory.position)
    memory.insert(transitions, td_error=td_error)
    slots = (position + np.arange(6)) % memory._ring.slots
    np.testing.assert_allclose(memory.priorities.get(slots).numpy(),
                               (np.abs(td_error) + 1e-6) ** 0.5, rtol=1e-5)
    stored = memory._ring.gather(slots)
    for key in FIELDS:
        np.testing.assert_allclose(stored[key].numpy(), transitions[key], err_msg=key)


def test_xla_writes_what_tensorflow_writes():
    def memory():
        return ReplayMemory(((K, SIDE, SIDE), tf.uint8), ACTION, 60, 4, 3, 0.9,
                            prioritized={"alpha": 0.6}, frame_stack={"frames": K, "window": 48})
    compiled, eager = memory(), memory()
    add = tf.function(lambda step: compiled.add(**step), jit_compile=True)
    add_eager = tf.function(lambda step: eager.add(**step))  # TensorFlow's kernels.
    episodes = Episodes(np.random.default_rng(4), 4, 0, 1)
    for _ in range(60):
        step = episodes.step(np.arange(4))
        add(step)
        add_eager(step)
    assert int(compiled.size) > 30
    # Frames, actions and indices bitwise; the n-step rewards and discounts to float32's
    # rounding, since XLA may contract a multiply and an add into one FMA (seen: 1 ulp).
    for key in compiled.storage:
        written, expected = compiled.storage[key].numpy(), eager.storage[key].numpy()
        if np.issubdtype(expected.dtype, np.floating):
            np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(written, expected, err_msg=key)
    np.testing.assert_allclose(compiled.priorities.tree.numpy(), eager.priorities.tree.numpy())


def test_a_write_of_more_slots_than_the_window_raises():
    memory = ReplayMemory(((K, SIDE, SIDE), tf.uint8), ACTION, 20, 5,
                          frame_stack={"frames": K, "window": 8})
    # Each agent's first stack repeats one frame, its next adds one: 10 new frames.
    step = Episodes(np.random.default_rng(0), 5, 0, 1).step(np.arange(5))
    with pytest.raises(tf.errors.InvalidArgumentError, match="raise replay_frame_stack.s window"):
        memory.add(**step)


@pytest.mark.parametrize("kwargs, culprit", [
    ({"observ_spec": ((K, SIDE, SIDE), tf.float32)}, "uint8"),
    ({"frames": 3}, "multiple of 3 frames"),
    ({"axis": 1}, "axis must be 0 or -1"),
    ({"window": 0}, "window must be an int"),
    ({"window": 30}, "at most the capacity"),
])
def test_bad_arguments_raise(kwargs, culprit):
    arguments = dict(observ_spec=((K, SIDE, SIDE), tf.uint8), action_spec=ACTION,
                     capacity=20, frames=K, axis=0, window=8)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=culprit):
        FrameStackStorage(**arguments)


def test_bad_frame_stack_setting_raises():
    with pytest.raises(ValueError, match="unknown frame_stack key"):
        ReplayMemory(((K, SIDE, SIDE), tf.uint8), ACTION, 20, 3,
                     frame_stack={"frames": K, "stride": 2})


def test_checkpoint_round_trip(tmp_path):
    memory, reference = _fill(0, 1, 3, prioritized={"alpha": 0.6})
    path = tf.train.Checkpoint(memory=memory).write(str(tmp_path / "replay"))
    restored = ReplayMemory(memory.observ_spec, ACTION, 60, 4, 3, 0.9,
                            prioritized={"alpha": 0.6},
                            frame_stack=memory.frame_stack)
    tf.train.Checkpoint(memory=restored).read(path).assert_consumed()
    assert int(restored.size) == int(memory.size)
    _assert_newest(restored, reference)
    np.testing.assert_array_equal(restored.sample(16)["index"], memory.sample(16)["index"])

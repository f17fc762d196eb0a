"""The Loop's `replay` (the memory of `save_replay: true`): kept once per run directory,
beside the latest checkpoint, whatever the number of checkpoints kept, restored with it, and
never mixed up with another checkpoint's after an interrupted save or a resume from an older
checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl.memories.replay import ReplayMemory
from tests.drivers.ppo_loops import mock_batch, ppo_loop

CAPACITY = 16


def _memory():
    return ReplayMemory(((3,), tf.float32), ((1,), tf.float32), CAPACITY, num_agents=2)


def _loop(logdir, replay):
    """A Loop (BatchPPO on 2 MockEnvironments, never run here) keeping `replay`."""
    loop, _, step, checkpoint = ppo_loop(logdir, mock_batch(2, (3, 6)), 4, 6, steps=1000,
                                         eval_every=40, eval_episodes=0, replay=replay)
    return loop, step, checkpoint


def _transitions(count, start):
    """`count` transitions whose values count up from `start` (a NumPy reference)."""
    values = np.arange(start, start + count, dtype=np.float32)
    return {"observ": np.stack([values] * 3, 1), "nextob": np.stack([values + 0.5] * 3, 1),
            "action": values[:, None] / 100, "reward": -values,
            "discount": np.full(count, 0.99, np.float32)}


def _stored(memory):
    """The memory's transitions, oldest first (it never wraps around here)."""
    size = int(memory.size.numpy())
    return {key: variable.numpy()[:size] for key, variable in memory.storage.items()}


def _assert_holds(memory, transitions):
    stored = _stored(memory)
    assert int(memory.size.numpy()) == len(transitions["reward"])
    for key, value in transitions.items():
        np.testing.assert_array_equal(stored[key], value, err_msg=key)


def _joined(*parts):
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def _names(directory):
    return sorted(path.name for path in directory.iterdir())


def test_the_replay_is_written_once_beside_the_latest_checkpoint_and_restored(tmp_path):
    memory = _memory()
    loop, step, _ = _loop(tmp_path, memory)
    parts = []
    for number in (40, 80, 120):
        parts.append(_transitions(3, number))
        memory.insert(parts[-1])
        step.assign(number)
        loop.save()
    assert _names(tmp_path / "replay") == ["ckpt-120.data-00000-of-00001", "ckpt-120.index"]
    for number in (40, 80, 120):  # The checkpoints hold no replay variable.
        names = [name for name, _ in tf.train.list_variables(str(tmp_path / f"ckpt-{number}"))]
        assert names and not [name for name in names if "replay" in name], number
    stored = dict(tf.train.list_variables(str(tmp_path / "replay" / "ckpt-120")))
    assert stored["replay/storage/observ/.ATTRIBUTES/VARIABLE_VALUE"] == [CAPACITY + 1, 3]

    restored = _memory()
    loop, step, _ = _loop(tmp_path, restored)
    assert loop.replay_restored is None
    assert loop.restore() == str(tmp_path / "ckpt-120")
    assert int(step.numpy()) == 120
    assert loop.replay_restored == str(tmp_path / "replay" / "ckpt-120")
    _assert_holds(restored, _joined(*parts))


def test_a_save_interrupted_before_its_checkpoint_resumes_with_the_earlier_replay(
        tmp_path, monkeypatch):
    memory = _memory()
    loop, step, _ = _loop(tmp_path, memory)
    first = _transitions(4, 0)
    memory.insert(first)
    step.assign(40)
    loop.save()
    memory.insert(_transitions(2, 50))
    step.assign(80)

    def killed(**_):  # The process dies after the replay, before the checkpoint.
        raise KeyboardInterrupt
    monkeypatch.setattr(loop.manager, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        loop.save()
    assert "ckpt-80.index" in _names(tmp_path / "replay")
    (tmp_path / "replay" / "ckpt-120_temp").mkdir()  # A replay write that was cut short.
    (tmp_path / "replay" / "ckpt-120_temp" / "part-00000-of-00001.index").write_bytes(b"?")

    restored = _memory()
    loop, step, _ = _loop(tmp_path, restored)
    assert loop.restore() == str(tmp_path / "ckpt-40")
    assert loop.replay_restored == str(tmp_path / "replay" / "ckpt-40")
    _assert_holds(restored, first)
    restored.insert(_transitions(1, 90))
    step.assign(80)
    loop.save()  # The strays of the interrupted saves go with the earlier replay.
    assert _names(tmp_path / "replay") == ["ckpt-80.data-00000-of-00001", "ckpt-80.index"]
    again = _memory()
    loop, step, _ = _loop(tmp_path, again)
    loop.restore()
    _assert_holds(again, _joined(first, _transitions(1, 90)))


def test_a_checkpoint_older_than_the_replay_restores_none(tmp_path):
    memory = _memory()
    loop, step, _ = _loop(tmp_path, memory)
    for number in (40, 80):
        memory.insert(_transitions(2, number))
        step.assign(number)
        loop.save()
    # The user goes back to ckpt-40: it becomes the latest checkpoint again.
    for path in tmp_path.glob("ckpt-80*"):
        path.unlink()
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-40"\nall_model_checkpoint_paths: "ckpt-40"\n')

    restored = _memory()
    loop, step, _ = _loop(tmp_path, restored)
    assert loop.restore() == str(tmp_path / "ckpt-40")
    assert loop.replay_restored is None  # Not the replay of step 80.
    assert int(restored.size.numpy()) == 0
    restored.insert(_transitions(1, 60))
    step.assign(60)
    loop.save()
    assert _names(tmp_path / "replay") == ["ckpt-60.data-00000-of-00001", "ckpt-60.index"]


def test_a_run_of_the_older_layout_restores_the_replay_inside_its_checkpoint(tmp_path):
    """Before the replay had a directory of its own, every checkpoint held it as `replay`."""
    loop, step, checkpoint = _loop(tmp_path / "new", None)
    memory = _memory()
    transitions = _transitions(5, 7)
    memory.insert(transitions)
    step.assign(40)
    older = tf.train.Checkpoint(step=step, replay=memory, **{
        name: value for name, value in checkpoint._trackable_children().items()
        if name != "step"})
    tf.train.CheckpointManager(older, str(tmp_path / "old"), 5).save(checkpoint_number=40)

    restored = _memory()
    loop, step, _ = _loop(tmp_path / "old", restored)
    assert loop.restore() == str(tmp_path / "old" / "ckpt-40")
    assert loop.replay_restored == str(tmp_path / "old" / "ckpt-40")
    _assert_holds(restored, transitions)

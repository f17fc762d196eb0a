"""The checkpoints of a training run, with the replay memory kept once per run directory
beside the latest one."""

import os
import pathlib

import numpy as np
import tensorflow as tf


class Checkpoints:
    """Writes and restores the checkpoints of a run directory (`tf.train.CheckpointManager`
    in `logdir`, the last `keep` of them), and the replay memory beside the latest one.

    A `replay` (the replay memory of `save_replay: true`) is kept once per run directory,
    not in every checkpoint: `save` writes it to `LOGDIR/replay/ckpt-S` (S the global
    step, the name of the checkpoint it belongs to), then the checkpoint `LOGDIR/ckpt-S`,
    and only then deletes the replay of earlier checkpoints. A process stopped at any point
    thus leaves the latest checkpoint with its own replay beside it (an unfinished
    `replay/ckpt-S` belongs to no checkpoint yet and is deleted by the next save).
    `restore` reads the replay of the checkpoint it restores: `replay/ckpt-S`, or, for a
    run written before the replay had a directory of its own, the one inside `ckpt-S`.
    A checkpoint without its replay (the run was resumed from an older checkpoint than the
    latest, e.g. after deleting the newer ones, or `replay/` was deleted) restores none:
    the memory starts empty rather than holding transitions collected after the
    checkpoint's step, and the next save replaces the replay that was there
    (`replay_restored` tells which happened).

    Args:
      logdir: run directory (str or path).
      checkpoint: `tf.train.Checkpoint` holding the global step and the algorithm's state.
      keep: number of checkpoints kept.
      replay: optional trackable (the algorithm's replay memory), saved as above.
    """

    def __init__(self, logdir, checkpoint, keep, replay=None):
        self._checkpoint = checkpoint
        self._manager = tf.train.CheckpointManager(checkpoint, logdir, max_to_keep=keep)
        self._replay = None if replay is None else tf.train.Checkpoint(replay=replay)
        self._replay_dir = pathlib.Path(logdir, "replay")
        self._replay_restored = None

    @property
    def manager(self):
        """The `tf.train.CheckpointManager` of the run directory."""
        return self._manager

    @property
    def replay_restored(self):
        """Where `restore` read the `replay` from (str: a checkpoint prefix), or None when
        it restored none (no `replay`, no checkpoint, or the checkpoint's replay is
        missing: see the class)."""
        return self._replay_restored

    def restore(self):
        """Restores the latest checkpoint if there is one, and the `replay` saved with it
        (see the class); returns the checkpoint's path or None."""
        path = self._manager.latest_checkpoint
        if path:
            self._checkpoint.restore(path).assert_existing_objects_matched()
            if self._replay is not None:
                self._replay_restored = self._restore_replay(path)
        return path

    def _restore_replay(self, path):
        """Reads the replay of the checkpoint `path`; returns where from, or None."""
        own = self._replay_dir / os.path.basename(path)
        if tf.io.gfile.exists(f"{own}.index"):
            self._replay.read(str(own)).assert_consumed()
            return str(own)
        # A run of an older release kept the replay inside each checkpoint.
        if any(name.startswith("replay/") for name, _ in tf.train.list_variables(path)):
            self._replay.read(path).expect_partial().assert_existing_objects_matched()
            return path
        return None

    def _delete_replays_but(self, name):
        """Deletes the files of the replays in `LOGDIR/replay` other than `name`'s
        (`ckpt-S`), unfinished ones included."""
        for entry in self._replay_dir.glob("ckpt-*"):
            if entry.name.split(".")[0] == name:
                continue
            if entry.is_dir():  # `ckpt-S_temp`, what an interrupted write left.
                tf.io.gfile.rmtree(str(entry))
            else:
                entry.unlink(missing_ok=True)

    def save(self, step):
        """Writes the checkpoint `ckpt-{step}` (int `step`: the global step), and the
        `replay` beside it (see the class); returns the checkpoint's path.

        Raises:
          FloatingPointError: a variable holds NaN or infinite values; nothing is written,
            so the last good checkpoint stays the latest.
        """
        bad = _non_finite_variables(self._checkpoint) + (
            [] if self._replay is None else _non_finite_variables(self._replay))
        if bad:
            raise FloatingPointError(
                f"not saving a checkpoint at step {step:,}: non-finite "
                f"values in {', '.join(bad[:5])}; the latest checkpoint is "
                f"{self._manager.latest_checkpoint}")
        if self._replay is not None:
            self._replay.write(str(self._replay_dir / f"ckpt-{step}"))
        path = self._manager.save(checkpoint_number=step)
        if self._replay is not None:
            self._delete_replays_but(os.path.basename(path))
        return path


def _non_finite_variables(checkpoint):
    """Names of the float variables under `checkpoint` that hold NaN or infinite values."""
    names = []
    for item in tf.train.TrackableView(checkpoint).descendants():
        if not (hasattr(item, "numpy") and hasattr(item, "dtype")):
            continue
        if tf.as_dtype(item.dtype).is_floating and not np.isfinite(item.numpy()).all():
            names.append(getattr(item, "path", None) or item.name)
    return names

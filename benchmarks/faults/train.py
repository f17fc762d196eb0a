"""`python -m batchrl.scripts.train` that can stall inside a checkpoint write, for
`python -m benchmarks.faults` (run as `python -m benchmarks.faults.train`).

With `BATCHRL_STALL_STAGE=STAGE`, `BATCHRL_STALL_SAVE=N` and `BATCHRL_STALL_MARKER=PATH`
set, the N-th `tf.train.CheckpointManager.save` of this process stops at STAGE, writes the
prefix of the checkpoint being saved into the file PATH and sleeps for an hour, so that the
fault script can SIGKILL the trainer there. The stages, in the order of TF 2.21's
`CheckpointManager.save` -> `Checkpoint._write`:

- `shards`: the variables are in the temporary files `ckpt-S_temp/part-*`, not yet merged
  into `ckpt-S.index` and `ckpt-S.data-*` (before `MergeV2Checkpoints` in
  `functional_saver.MultiDeviceSaver.save`);
- `merged`: `ckpt-S.index` and `ckpt-S.data-*` are complete, but the `checkpoint` index file
  still names the previous checkpoint (before the manager's first
  `update_checkpoint_state_internal`);
- `sweep`: the `checkpoint` index file names `ckpt-S`, and the manager, deleting the
  checkpoints beyond `max_to_keep`, has deleted the `.index` file of the oldest one but not
  its data file (after the first `_delete_file_if_exists`; needs N > `max_to_keep`).

Without these variables this is the trainer unchanged. The batchrl package is not modified:
TensorFlow's functions are wrapped in this process only.
"""

import functools
import os
import sys
import time

STAGES = ("shards", "merged", "sweep")
STAGE_VARIABLE = "BATCHRL_STALL_STAGE"
SAVE_VARIABLE = "BATCHRL_STALL_SAVE"
MARKER_VARIABLE = "BATCHRL_STALL_MARKER"


def install(stage, save, marker):
    """Makes the `save`-th checkpoint save of this process stall at `stage` (see above)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # As the trainer does, before TF.
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choices: {', '.join(STAGES)}")
    import tensorflow as tf
    from tensorflow.python.checkpoint import checkpoint_management, functional_saver

    state = {"saves": 0, "prefix": None}

    def stall():
        temporary = f"{marker}.tmp"
        with open(temporary, "w") as file:
            file.write(state["prefix"] + "\n")
        os.replace(temporary, marker)
        time.sleep(3600)

    def armed():
        return state["saves"] == save

    manager_save = tf.train.CheckpointManager.save

    @functools.wraps(manager_save)
    def save_wrapper(self, checkpoint_number=None, *args, **kwargs):
        state["saves"] += 1
        number = checkpoint_number if checkpoint_number is not None else "?"
        state["prefix"] = os.path.join(self.directory, f"ckpt-{number}")
        return manager_save(self, checkpoint_number, *args, **kwargs)

    tf.train.CheckpointManager.save = save_wrapper

    if stage == "shards":
        io_ops = functional_saver.gen_io_ops
        merge = io_ops.merge_v2_checkpoints

        @functools.wraps(merge)
        def merge_wrapper(*args, **kwargs):
            if armed():
                stall()
            return merge(*args, **kwargs)

        io_ops.merge_v2_checkpoints = merge_wrapper
    elif stage == "merged":
        update = checkpoint_management.update_checkpoint_state_internal

        @functools.wraps(update)
        def update_wrapper(*args, **kwargs):
            if armed():
                stall()
            return update(*args, **kwargs)

        checkpoint_management.update_checkpoint_state_internal = update_wrapper
    else:
        delete = checkpoint_management._delete_file_if_exists

        @functools.wraps(delete)
        def delete_wrapper(*args, **kwargs):
            result = delete(*args, **kwargs)
            if armed():
                stall()
            return result

        checkpoint_management._delete_file_if_exists = delete_wrapper


def main(argv=None):
    """The trainer with `argv`, the stall installed when the variables above are set;
    returns its exit code."""
    stage = os.environ.get(STAGE_VARIABLE)
    if stage:
        install(stage, int(os.environ[SAVE_VARIABLE]), os.environ[MARKER_VARIABLE])
    from batchrl.scripts import train

    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""What a fault trial leaves behind, read after the run: the processes that still carry
the trial's marker, and the run directory's checkpoint files (readable, holding the replay
memory, interrupted at a write stage, strays)."""

import os
import pathlib
import re
import time

MARKER = "BATCHRL_FAULT_TRIAL"  # The environment variable that marks a trial's processes.
REPLAY_SIZE = "replay/_size/.ATTRIBUTES/VARIABLE_VALUE"  # The memory's size in its file.


def leftover_processes(trial, grace=0.0):
    """PIDs of processes whose environment carries the trial's marker, once they are all
    gone or `grace` seconds have passed."""
    deadline = time.monotonic() + grace
    while True:
        found = marked_processes(trial)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def process_name(pid):
    """The first 60 characters of process `pid`'s command line ("?" once it is gone)."""
    try:
        command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "?"
    return command.decode(errors="replace").strip()[:60] or "?"


def marked_processes(value, variable=MARKER):
    """PIDs of the other processes whose environment sets `variable` to `value` (the
    trial's marker by default)."""
    needle = f"{variable}={value}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def checkpoint_readable(logdir):
    """Whether the latest checkpoint of `logdir` (if any) can be read."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(str(logdir))
    if path is None:
        return True  # Nothing written yet is not a broken checkpoint.
    try:
        tf.train.load_checkpoint(path).get_variable_to_shape_map()
        return True
    except Exception:  # noqa: BLE001 - any failure to read counts.
        return False


def replay_kept(logdir, capacity):
    """Whether the replay memory saved with the latest checkpoint `ckpt-S` of `logdir`
    (`save_replay: true` keeps it in `logdir/replay/ckpt-S`) holds one transition per
    training step before it, as the memory of a finished run whose resumes restored it
    does, with `capacity` above the run's steps: a resume that started with an empty memory
    would hold only the steps since. Returns `(bool, description)`.
    """
    import tensorflow as tf

    path = tf.train.latest_checkpoint(str(logdir))
    if path is None:
        return False, "no checkpoint to hold the replay memory"
    name = pathlib.Path(path).name
    replay = pathlib.Path(logdir, "replay", name)
    if not pathlib.Path(f"{replay}.index").exists():
        return False, f"no replay memory saved with {name} (replay/{name})"
    try:
        size = tf.train.load_checkpoint(str(replay)).get_tensor(REPLAY_SIZE)
    except Exception:  # noqa: BLE001 - counted as an unreadable checkpoint.
        return False, "the replay memory cannot be read"
    step = step_of(name)
    expected = min(step, capacity)
    return int(size) == expected, (f"replay memory at step {step:,}: {int(size):,} "
                                   f"transitions (expected {expected:,})")


def checkpoint_index(logdir):
    """`(latest, listed)`: the checkpoints the `checkpoint` index file names (None, [])."""
    path = pathlib.Path(logdir) / "checkpoint"
    text = path.read_text() if path.exists() else ""
    latest = re.search(r'^model_checkpoint_path: "(.*)"', text, re.M)
    listed = re.findall(r'^all_model_checkpoint_paths: "(.*)"', text, re.M)
    return (latest.group(1) if latest else None), listed


def step_of(name):
    return int(name.rsplit("-", 1)[1]) if name else 0


def write_stage_seen(logdir, name, stage):
    """Whether the files in `logdir` show checkpoint `name` interrupted at `stage` (see
    benchmarks/faults/train.py); returns `(bool, description)`."""
    logdir = pathlib.Path(logdir)
    latest, listed = checkpoint_index(logdir)
    index = (logdir / f"{name}.index").exists()
    data = any(logdir.glob(f"{name}.data-*"))
    parts = sorted(p.name for p in (logdir / f"{name}_temp").glob("part-*"))
    if stage == "shards":
        seen = bool(parts) and not index and not data and latest != name
        return seen, (f"{name}_temp/ holds {len(parts)} part files, {name}.index "
                      f"{'present' if index else 'absent'}, the index names {latest}")
    if stage == "merged":
        seen = index and data and not parts and latest != name
        return seen, (f"{name}.index and .data {'present' if index and data else 'missing'}, "
                      f"the index names {latest}")
    oldest = listed[0] if listed else None
    half = (oldest is not None and oldest != name and not (logdir / f"{oldest}.index").exists()
            and any(logdir.glob(f"{oldest}.data-*")))
    seen = latest == name and half
    return seen, (f"the index names {latest} and lists {oldest}, whose .index is "
                  f"{'deleted and .data is not' if half else 'not half deleted'}")


def stray_files(logdir):
    """Checkpoint files and temporary directories in `logdir` of checkpoints the index does
    not list."""
    _, listed = checkpoint_index(logdir)
    return sorted(path.name for path in pathlib.Path(logdir).glob("ckpt-*")
                  if re.sub(r"(\.index|\.data-.*|_temp)$", "", path.name) not in listed)

"""The commands' persistent XLA compilation cache: the programs that XLA compiles for a run
(`jit_step`, `jit_update`) are written to disk and loaded, not compiled again, by every
later run of the same graph on this machine.

TensorFlow keeps the cache itself (`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=...`,
read when TensorFlow starts): an entry's name holds a fingerprint of the compiled graph and
of its input shapes, so a changed graph (another config, network or batchrl version)
compiles anew, and runs that differ only in their seed share one entry. TensorFlow writes an
entry to a temporary file and renames it, so a run stopped while writing leaves no partial
entry; one damaged later makes the command stop with a line naming the cache
(`damaged_entry_message`). `pendulum_native` (`jit_step`) traced and compiled its step
function in 4.0 s without an entry and 1.6 s with one (docs/throughput.md, "Why the code
is as it is").

The commands (`train`, and so the trials of `tune`) enable it (`enable`, through
`batchrl.scripts.train.start_tensorflow`) in `BATCHRL_XLA_CACHE` or, when that is unset,
in `$XDG_CACHE_HOME/batchrl/xla` (`~/.cache/batchrl/xla`); `BATCHRL_XLA_CACHE=off` turns it
off, and a cache directory already named in `TF_XLA_FLAGS` wins. Entries are named for this
machine's CPU features and TensorFlow's version (`prefix`), so that a cache shared between
machines never loads code compiled for other instructions. Beyond `MAX_BYTES`, the oldest
entries are deleted (`prune`).

Loading an entry makes TensorFlow 2.21 log three harmless ERROR lines (`HIT_LOG_LINES`),
which the training command filters out of a quiet run (`batchrl.scripts.quiet`).
This module never imports TensorFlow.
"""

import hashlib
import importlib.metadata
import os
import pathlib
import platform
import re
import time
import warnings

VARIABLE = "BATCHRL_XLA_CACHE"
FLAG = "--tf_xla_persistent_cache_directory"
MAX_BYTES = 512 * 2**20

# What TensorFlow 2.21 logs when it loads an entry, at ERROR level: it first tries to read
# the binary entry as text, and XLA's CPU loader names LLVM tuning options ("prefer no
# scatter / gather instructions") that the host's list of instruction sets lacks; the
# loaded program runs as compiled.
HIT_LOG_LINES = (
    r"text_format\.cc:\d+\] Error parsing text-format tensorflow\.XlaSerializedCacheEntry",
    r"cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. Target machine feature "
    r"\+prefer-no-(scatter|gather) is not\s+supported on the host machine",
)


def directory(environ=None):
    """The cache directory (`pathlib.Path`), or None when it is off.

    Args:
      environ: the environment variables (default: `os.environ`): `BATCHRL_XLA_CACHE` (a
        directory, or `off` / empty for none), else `XDG_CACHE_HOME`.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(VARIABLE)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "false", "no") else (
            pathlib.Path(value).expanduser())
    base = environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "batchrl" / "xla"


def prefix():
    """The file name prefix of this machine's entries (str): TensorFlow's version and a
    hash of the processor's architecture and instruction-set flags (`/proc/cpuinfo`)."""
    try:
        version = importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    features = platform.machine()
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
        flags = re.search(r"^(flags|Features)\s*:(.*)$", text, re.MULTILINE)
        features += " " + " ".join(sorted(flags.group(2).split())) if flags else ""
    except OSError:
        features += " " + platform.processor()
    digest = hashlib.sha256(features.encode()).hexdigest()[:16]
    return f"batchrl_tf{re.sub(r'[^0-9A-Za-z.]', '_', version)}_{digest}"


def enable(environ=None, max_bytes=MAX_BYTES):
    """Points TensorFlow's XLA cache at `directory()` (call before TensorFlow is imported).

    Adds the directory and `prefix()` to `TF_XLA_FLAGS` in `environ`, creates the directory
    and prunes it to `max_bytes`. Does nothing when the cache is off or `TF_XLA_FLAGS`
    already names a cache directory; warns (and leaves the cache off) when the directory
    cannot be created.

    Args:
      environ: the environment to change (default: `os.environ`).
      max_bytes: the size the cache's entries are pruned to (`prune`).

    Returns:
      The directory in use (`pathlib.Path`), or None.
    """
    environ = os.environ if environ is None else environ
    flags = environ.get("TF_XLA_FLAGS", "")
    if FLAG in flags:
        return None
    path = directory(environ)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        prune(path, max_bytes)
    except OSError as error:
        warnings.warn(f"XLA compilation cache off: cannot use {path}: {error} (set "
                      f"{VARIABLE}=off or another directory)", stacklevel=2)
        return None
    environ["TF_XLA_FLAGS"] = " ".join(filter(None, [
        flags, f"{FLAG}={path}", f"--tf_xla_persistent_cache_prefix={prefix()}"]))
    return path


def enabled(environ=None):
    """Whether `TF_XLA_FLAGS` in `environ` (default: `os.environ`) names a cache directory
    (bool)."""
    environ = os.environ if environ is None else environ
    return FLAG in environ.get("TF_XLA_FLAGS", "")


def damaged_entry_message(error, environ=None):
    """A one-line explanation (str) when `error`, raised by a TensorFlow call, is TensorFlow
    failing to read an entry of the cache in use (an entry cut short after it was written:
    TensorFlow 2.21 raises `OutOfRangeError: Read less bytes than requested`); None for
    any other error or without a cache."""
    environ = os.environ if environ is None else environ
    found = re.search(rf"{FLAG}=(\S+)", environ.get("TF_XLA_FLAGS", ""))
    if found is None or "Read less bytes than requested" not in str(error):
        return None
    return (f"cannot read an entry of the XLA compilation cache in {found.group(1)} "
            f"({type(error).__name__}: {str(error).splitlines()[0]}): delete that directory "
            f"or run with {VARIABLE}=off")


def prune(path, max_bytes=MAX_BYTES):
    """Deletes the oldest entries (by modification time) of the cache in `path` until the
    rest take at most `max_bytes`, and temporary files of interrupted writes older than an
    hour.

    Returns:
      The number of files deleted (int).
    """
    entries, stale = [], []
    now = time.time()
    for item in pathlib.Path(path).iterdir():
        if not item.is_file():
            continue
        status = item.stat()
        if item.suffix == ".pb":
            entries.append((status.st_mtime, status.st_size, item))
        elif item.suffix == ".tmp" and now - status.st_mtime > 3600:
            stale.append(item)
    total = sum(size for _, size, _ in entries)
    for _, size, item in sorted(entries):
        if total <= max_bytes:
            break
        stale.append(item)
        total -= size
    for item in stale:
        item.unlink(missing_ok=True)
    return len(stale)

"""A quiet start for the command-line programs: TensorFlow's start-up logs hidden unless
`--verbose`.

TensorFlow 2.21 prints, before a program's own first line:

- while `import tensorflow` runs, twice (about a second apart):
  `WARNING: All log messages before absl::InitializeLog() is called are written to STDERR`,
  `I0000 ... port.cc:153] oneDNN custom operations are on...` and
  `I0000 ... cudart_stub.cc:31] Could not find cuda drivers...`. absl writes these before
  TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` (they appear even with 3; no environment variable
  of absl or glog hides them), so only file descriptor 2 sent elsewhere hides them:
  `hidden_stderr`;
- at the first use of the devices (`tf.config.list_physical_devices()` or the first op),
  not at import: `E0000 ... cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN ERROR
  (303)` on a machine without a GPU driver. `TF_CPP_MIN_LOG_LEVEL=3` hides it, but also
  every later C++ error line of the run; the programs instead list the devices inside
  `hidden_stderr`, right after the import, and keep level 2;
- at level 0 (TensorFlow's default), `I0000 ... cpu_feature_guard.cc] This TensorFlow binary
  is optimized to use available CPU instructions...` during the import.

The programs (`batchrl.scripts.train.start_tensorflow`) call `set_log_level(verbose)` before
anything imports TensorFlow, then import it and list the devices in
`with hidden_stderr(not verbose):`. Only that window is hidden: Python warnings and errors
of batchrl and the C++ ERROR and FATAL lines after start-up reach stderr. This module never
imports TensorFlow.
"""

import contextlib
import os
import subprocess
import sys
import tempfile

LOG_LEVEL = "2"  # TF_CPP_MIN_LOG_LEVEL of a quiet run: C++ INFO and WARNING lines hidden.
# ERROR lines that TensorFlow 2.21 logs in normal runs, which a quiet training run drops
# (`filtered_stderr`): oneDNN's word that it leaves uint8 ops (image observations) to
# Eigen's kernels, once per op.
HARMLESS_LOG_LINES = (
    r"util\.cc:\d+\] oneDNN supports DT_UINT8 only on platforms with AVX-512",)


def add_verbose_flag(parser):
    """Adds the programs' `--verbose` flag (bool `args.verbose`) to the
    `argparse.ArgumentParser` `parser`."""
    parser.add_argument(
        "--verbose", action="store_true",
        help="show TensorFlow's start-up logs (hidden by default; TF_CPP_MIN_LOG_LEVEL, "
             "when set, chooses which C++ log lines follow)")


def set_log_level(verbose):
    """Sets `TF_CPP_MIN_LOG_LEVEL` for TensorFlow's C++ logs (read when TensorFlow is
    imported, so call this first).

    A quiet run (`verbose` false) gets `LOG_LEVEL` ("2": ERROR and FATAL lines only) unless
    the user's environment sets the variable, whose value then wins (e.g.
    `TF_CPP_MIN_LOG_LEVEL=0` to see TensorFlow's INFO lines after start-up). A verbose run
    leaves the variable as it is (unset: TensorFlow's default 0, every line).

    Args:
      verbose: bool, the programs' `--verbose`.

    Returns:
      The value of `TF_CPP_MIN_LOG_LEVEL` now in `os.environ` (str), or None when unset.
    """
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", LOG_LEVEL)
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL")


def is_quiet():
    """Whether TensorFlow's C++ logs show ERROR lines and nothing less
    (`TF_CPP_MIN_LOG_LEVEL` is `LOG_LEVEL`, as `set_log_level` sets it for a quiet run)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL") == LOG_LEVEL


@contextlib.contextmanager
def hidden_stderr(hide=True):
    """Sends file descriptor 2 (C, C++ and Python stderr alike) to a temporary file while
    the block runs, and restores it after, however the block ends.

    When the block raises an `Exception`, what it wrote is copied to the real stderr before
    the exception goes on, so that a failing TensorFlow import still explains itself. A
    process killed inside the block (e.g. a C++ abort) loses those lines: run with
    `--verbose` to see them. Not thread-safe: other threads' stderr is hidden too.

    Args:
      hide: bool; false makes this a no-op (the programs' `--verbose`).

    Yields:
      None.
    """
    saved = _duplicate_stderr() if hide else None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        except Exception:
            _restore(saved)
            saved = None
            log.seek(0)
            text = log.read()
            while text:
                text = text[os.write(2, text):]
            raise
        finally:
            if saved is not None:
                _restore(saved)


def _duplicate_stderr():
    """Flushes Python's streams and returns a duplicate of file descriptor 2 (int), or None
    when the process has none (a daemon: nothing to hide or filter)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return os.dup(2)
    except OSError:
        return None


def _restore(saved):
    """Points file descriptor 2 back at `saved` (a duplicate of it) and closes `saved`."""
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


# The filter process of `filtered_stderr`: forwards the lines of its standard input that
# match none of its argument patterns to its standard output, each at once.
_FILTER = """
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
patterns = [re.compile(pattern.encode()) for pattern in sys.argv[1:]]
for line in sys.stdin.buffer:
    if not any(pattern.search(line) for pattern in patterns):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""


@contextlib.contextmanager
def filtered_stderr(patterns, enabled=True):
    """Drops the lines that C and C++ code (TensorFlow's logs) write to stderr while the
    block runs when they match one of `patterns`; every other line passes.

    File descriptor 2 goes to a pipe read by a filter process, which forwards the lines
    that pass at once. The filter runs in a session of its own (Ctrl-C does not stop it)
    and outlives this process: a line written just before a crash (a C++ FATAL line, then
    an abort) still reaches the real stderr. Python's own `sys.stderr` writes bypass the
    filter: inside the block `sys.stderr` is a file on the real stderr, so progress bars
    still see a terminal. C++ lines may thus reach the terminal a few milliseconds after
    Python lines written later. Processes started inside the block inherit the pipe as
    their stderr; the block's end waits at most 1 s for the filter to forward what they
    wrote.

    Args:
      patterns: regular expressions (str), searched for in each line.
      enabled: bool; false makes this a no-op.

    Yields:
      None.
    """
    saved = _duplicate_stderr() if enabled and patterns else None
    if saved is None:
        yield
        return
    read, write = os.pipe()
    filter_process = subprocess.Popen(
        [sys.executable, "-I", "-c", _FILTER, *patterns], stdin=read, stdout=saved,
        start_new_session=True)
    os.close(read)
    python_stderr = sys.stderr
    sys.stderr = open(saved, "w", buffering=1, encoding=python_stderr.encoding,  # noqa: SIM115
                      errors=python_stderr.errors, closefd=False)
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = python_stderr
        _restore(saved)  # Closes this process's last end of the pipe.
        try:
            filter_process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # A process started in the block holds the pipe.
            pass

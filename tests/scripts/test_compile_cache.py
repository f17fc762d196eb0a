"""The commands' persistent XLA compilation cache (`batchrl.scripts.compile_cache`) and the
filter that keeps its log lines out of a quiet run (`quiet.filtered_stderr`)."""

import importlib.metadata
import os
import re
import subprocess
import sys
import time

import pytest

from batchrl.scripts import compile_cache
from tests.scripts.test_quiet_start import TF_LOG


def test_directory_follows_the_environment(tmp_path):
    home = {"HOME": str(tmp_path)}
    assert compile_cache.directory({**home, "BATCHRL_XLA_CACHE": str(tmp_path / "c")}) == (
        tmp_path / "c")
    for off in ("off", "OFF", "", "0", "false"):
        assert compile_cache.directory({**home, "BATCHRL_XLA_CACHE": off}) is None, off
    assert compile_cache.directory({"XDG_CACHE_HOME": str(tmp_path / "x")}) == (
        tmp_path / "x" / "batchrl" / "xla")


def test_enable_adds_the_flags_and_keeps_the_users_own(tmp_path):
    environ = {"BATCHRL_XLA_CACHE": str(tmp_path / "cache"),
               "TF_XLA_FLAGS": "--tf_xla_auto_jit=0"}
    assert compile_cache.enable(environ) == tmp_path / "cache"
    assert (tmp_path / "cache").is_dir()
    flags = environ["TF_XLA_FLAGS"].split()
    assert flags[0] == "--tf_xla_auto_jit=0"
    assert f"--tf_xla_persistent_cache_directory={tmp_path / 'cache'}" in flags
    assert f"--tf_xla_persistent_cache_prefix={compile_cache.prefix()}" in flags
    assert compile_cache.enabled(environ)
    # Enabled once: a second call (or a directory the user named) changes nothing.
    before = dict(environ)
    assert compile_cache.enable(environ) is None and environ == before
    users = {"TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory=/elsewhere"}
    assert compile_cache.enable(dict(users, BATCHRL_XLA_CACHE=str(tmp_path))) is None
    off = {"BATCHRL_XLA_CACHE": "off"}
    assert compile_cache.enable(off) is None and not compile_cache.enabled(off)


def test_an_unusable_directory_warns_and_leaves_the_cache_off(tmp_path):
    (tmp_path / "file").write_text("")
    environ = {"BATCHRL_XLA_CACHE": str(tmp_path / "file" / "cache")}
    with pytest.warns(UserWarning, match="XLA compilation cache off: cannot use .*file"):
        assert compile_cache.enable(environ) is None
    assert "TF_XLA_FLAGS" not in environ


def test_prefix_names_tensorflow_and_stays_the_same():
    prefix = compile_cache.prefix()
    assert prefix == compile_cache.prefix()
    assert prefix.startswith(f"batchrl_tf{importlib.metadata.version('tensorflow')}_")
    assert re.fullmatch(r"[0-9A-Za-z._]+", prefix), prefix


def test_prune_deletes_the_oldest_entries_and_stale_temporary_files(tmp_path):
    now = time.time()
    for age, name, size in [(50, "a.pb", 400), (40, "b.pb", 300), (30, "c.pb", 300),
                            (20, "d.pb", 200), (7200, "old.pbvm-1.tmp", 10),
                            (10, "new.pbvm-2.tmp", 10)]:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        os.utime(path, (now - age, now - age))
    assert compile_cache.prune(tmp_path, max_bytes=600) == 3
    # The two newest entries (500 bytes) fit; a write still under way is kept.
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "c.pb", "d.pb", "new.pbvm-2.tmp"]
    assert compile_cache.prune(tmp_path, max_bytes=600) == 0


def _filtered(tmp_path, body):
    """Runs `body` (Python statements) inside `quiet.filtered_stderr` in a new process that
    drops lines matching "secret \\d+" or "drop me"; returns (exit code, stderr)."""
    script = tmp_path / "filtered.py"
    script.write_text(
        "import os, sys\nfrom batchrl.scripts import quiet\n"
        "print('python before', file=sys.stderr, flush=True)\n"
        "with quiet.filtered_stderr([r'secret \\d+', 'drop me']):\n"
        + "".join(f"    {line}\n" for line in body)
        + "os.write(2, b'after the block\\n')\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=60)
    time.sleep(0.2)  # After a crash, the filter forwards the last lines on its own.
    return result.returncode, result.stderr


def test_filtered_stderr_drops_the_matching_c_lines_only(tmp_path):
    code, stderr = _filtered(tmp_path, [
        "os.write(2, b'keep this C line\\n')",
        "os.write(2, b'E0000 secret 42 in the middle\\n')",
        "os.write(2, b'please drop me now\\n')",
        "os.write(2, b'secret without a number stays\\n')",
        "print('python inside', file=sys.stderr, flush=True)",
        "assert sys.stderr.fileno() != 2  # Python writes bypass the filter.",
    ])
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert sorted(lines) == sorted([
        "python before", "keep this C line", "secret without a number stays",
        "python inside", "after the block"]), stderr
    assert lines[-1] == "after the block"


def test_filtered_stderr_forwards_the_last_line_before_a_crash(tmp_path):
    code, stderr = _filtered(tmp_path, [
        "os.write(2, b'F0000 the reason of the crash\\n')", "os.abort()"])
    assert code != 0
    assert "F0000 the reason of the crash" in stderr, stderr


def test_filtered_stderr_restores_stderr_when_the_block_raises(tmp_path):
    code, stderr = _filtered(tmp_path, [
        "os.write(2, b'drop me\\n')", "raise KeyError('from the block')"])
    assert code == 1
    assert "KeyError: 'from the block'" in stderr and "drop me" not in stderr


# One train phase of one call (4 agents x 100 steps, updates within) and one eval episode.
NATIVE_RUN = ["--config=cartpole_native", "--set", "steps=400", "--set", "eval_every=400",
              "--set", "eval_episodes=1", "--set", "num_agents=4", "--set", "update_every=4",
              "--set", "update_epochs=1", "--no-progress"]


def _train(logdir, cache, *flags):
    env = dict(os.environ, BATCHRL_XLA_CACHE=str(cache))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # A user's quiet default.
    env.pop("TF_XLA_FLAGS", None)
    return subprocess.run(
        [sys.executable, "-m", "batchrl.scripts.train", f"--logdir={logdir}", *NATIVE_RUN,
         *flags], capture_output=True, text=True, timeout=300, env=env)


def test_a_second_run_loads_the_compiled_program_quietly_and_trains_the_same(tmp_path):
    """Also the commands' quiet start (`batchrl.scripts.quiet`): a user's first run prints
    no TensorFlow log line, its first line is its own; `--verbose` shows them."""
    cache = tmp_path / "cache"
    first = _train(tmp_path / "first", cache)
    assert first.returncode == 0, first.stderr
    lines = [line for line in (first.stdout + first.stderr).splitlines() if line.strip()]
    assert [line for line in lines if TF_LOG.search(line)] == [], lines
    assert first.stdout.startswith("Training batchrl.native_tasks:CartPole"), first.stdout
    entries = list(cache.glob(f"{compile_cache.prefix()}__*.pb"))
    assert len(entries) == 1, sorted(cache.iterdir())
    written = entries[0].stat()

    second = _train(tmp_path / "second", cache)
    assert second.returncode == 0, second.stderr
    assert [line for line in second.stderr.splitlines() if TF_LOG.search(line)] == [], (
        second.stderr)
    # The entry was read, not compiled and written again.
    assert list(cache.iterdir()) == entries
    assert (entries[0].stat().st_ino, entries[0].stat().st_mtime_ns) == (
        written.st_ino, written.st_mtime_ns)
    final = re.compile(r"^Final eval mean_score .*$", re.MULTILINE)
    assert final.findall(second.stdout) == final.findall(first.stdout) != []

    # An entry cut short after it was written: one error line naming the cache. Run
    # without the filter (--verbose), TensorFlow's lines of reading an entry show too: the
    # patterns of HIT_LOG_LINES still match what this TensorFlow prints. The parse error
    # comes on every machine (TensorFlow tries the entry as text first); the AOT loader's
    # line only on a CPU that lacks a feature the entry was compiled with, and then it must
    # match its pattern (on a hit, the quiet second run above shows no line that the
    # filter missed).
    entries[0].write_bytes(entries[0].read_bytes()[:100_000])
    damaged = _train(tmp_path / "damaged", cache, "--verbose")
    assert damaged.returncode == 1, damaged.stderr
    if os.uname().machine == "x86_64":  # TF 2.21 prints its oneDNN line at import there.
        assert TF_LOG.search(damaged.stderr), damaged.stderr[-3000:]
    parse, loader = compile_cache.HIT_LOG_LINES
    assert re.search(parse, damaged.stderr), (parse, damaged.stderr[-3000:])
    if "Target machine feature" in damaged.stderr:
        assert re.search(loader, damaged.stderr), (loader, damaged.stderr[-3000:])
    assert damaged.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot read an entry of the XLA compilation cache in {cache} "
        "(OutOfRangeError: "), damaged.stderr
    assert "Traceback" not in damaged.stderr


def test_only_a_failed_read_of_the_cache_is_explained():
    error = RuntimeError("Read less bytes than requested [Op:__inference_run_7]")
    environ = {"TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory=/c --other"}
    assert compile_cache.damaged_entry_message(error, environ) == (
        "cannot read an entry of the XLA compilation cache in /c (RuntimeError: Read less "
        "bytes than requested [Op:__inference_run_7]): delete that directory or run with "
        "BATCHRL_XLA_CACHE=off")
    assert compile_cache.damaged_entry_message(error, {}) is None
    assert compile_cache.damaged_entry_message(RuntimeError("other"), environ) is None


def test_train_in_a_python_process_leaves_its_stderr_alone(tmp_path, monkeypatch):
    # Only the command filters (it owns its process); a notebook's sys.stderr stays.
    from batchrl import configs
    from batchrl.scripts import quiet, train

    monkeypatch.setenv("TF_XLA_FLAGS", f"{compile_cache.FLAG}={tmp_path / 'cache'}")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", quiet.LOG_LEVEL)
    seen = []
    original = quiet.filtered_stderr

    def recording(patterns, enabled=True):
        seen.append(enabled)
        return original(patterns, enabled)

    monkeypatch.setattr(quiet, "filtered_stderr", recording)
    # Eager: no function to trace; whether the command filters does not depend on it.
    config = configs.load("pendulum", ["steps=20", "eval_every=20", "num_agents=2",
                                       "eval_episodes=0", "steps_per_call=10", "eager=true"])
    stderr = sys.stderr
    train.train(config, tmp_path / "run", progress=False)
    assert seen == [False] and sys.stderr is stderr
    train.train(config, tmp_path / "run2", progress=False, filter_logs=True)
    assert seen == [False, True] and sys.stderr is stderr

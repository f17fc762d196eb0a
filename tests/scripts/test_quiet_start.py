"""A quiet start: the programs print no TensorFlow log line before their own first line
unless `--verbose` (`batchrl.scripts.quiet`)."""

import os
import re
import subprocess
import sys

import pytest

from batchrl.scripts import export, quiet, train, visualize

# TensorFlow's C++ log lines (absl format: `I0000 00:00:... file.cc:12] ...`), absl's notice
# before its initialization, and the start-up messages of TF 2.21 on a machine without GPU.
TF_LOG = re.compile(r"^[IWEF]\d{4} |WARNING: All log messages before absl|oneDNN|cuda",
                    re.IGNORECASE)
SHORT_RUN = ["--config=pendulum", "--set", "steps=100", "--set", "eval_every=100",
             "--set", "num_agents=2", "--set", "update_every=2", "--set", "update_epochs=1",
             "--set", "eval_episodes=1", "--set", "steps_per_call=10", "--no-progress"]


def _user_environment():
    """The environment of a user who set no TensorFlow variable (pytest's conftest sets
    TF_CPP_MIN_LOG_LEVEL for its own process)."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def _run(program, *flags):
    """Runs `python -m batchrl.scripts.PROGRAM` as a user would; returns the exit code and
    the non-empty lines of stdout and stderr merged."""
    result = subprocess.run(
        [sys.executable, "-m", f"batchrl.scripts.{program}", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        env=_user_environment())
    return result.returncode, [line for line in result.stdout.splitlines() if line.strip()]


def test_export_prints_no_tensorflow_log(tmp_path, capsys):
    """(The training command's quiet start: test_compile_cache.py's first run, with this
    module's TF_LOG.) The run is trained in this process, where TensorFlow already runs."""
    assert train.main([f"--logdir={tmp_path / 'run'}", *SHORT_RUN]) == 0
    capsys.readouterr()
    # export's find_run imports TensorFlow to find the latest checkpoint.
    code, lines = _run("export", f"--logdir={tmp_path / 'run'}",
                       f"--outdir={tmp_path / 'model'}")
    assert code == 0, lines
    assert len(lines) == 1 and lines[0].startswith("Exported the policy of"), lines


def _python(code):
    """Runs `python -c code` in the user's environment; returns its CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=_user_environment())


def test_quiet_start_then_stderr_reaches_the_user_and_matplotlib_and_pandas_import():
    # After the start, fd 2 is the user's again: Python warnings and C-level writes show.
    # Keras would import matplotlib.pyplot and pandas while TensorFlow is imported; the
    # commands hide them then, and a later import of either still works.
    code = ("import os, sys, warnings; from batchrl.scripts import train; "
            "train.start_tensorflow(); warnings.warn('batchrl says'); "
            "os.write(2, b'c level line\\n'); "
            "import keras; print('matplotlib' in sys.modules, 'pandas' in sys.modules); "
            "import matplotlib.pyplot, pandas; print(matplotlib.pyplot.__name__, "
            "pandas.__name__)")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "UserWarning: batchrl says" in lines[0], result.stderr
    assert "c level line" in lines, result.stderr
    assert [line for line in lines if TF_LOG.search(line)] == [], result.stderr
    assert result.stdout.split() == ["False", "False", "matplotlib.pyplot", "pandas"]


def test_hidden_stderr_hides_fd_2_only_inside_the_block(capfd):
    os.write(2, b"before\n")
    with quiet.hidden_stderr():
        os.write(2, b"hidden\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nafter\n"


def test_hidden_stderr_replays_the_block_output_when_it_raises(capfd):
    with pytest.raises(ImportError, match="no such module"):
        with quiet.hidden_stderr():
            os.write(2, b"why it failed\n")
            raise ImportError("no such module")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "why it failed\nafter\n"


def test_hidden_stderr_off_is_a_no_op(capfd):
    with quiet.hidden_stderr(hide=False):
        os.write(2, b"shown\n")
    assert capfd.readouterr().err == "shown\n"


def test_set_log_level_keeps_the_users_value(monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert quiet.set_log_level(verbose=True) is None
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    assert quiet.set_log_level(verbose=False) == "2"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert quiet.set_log_level(verbose=False) == "0"


@pytest.mark.parametrize("program", [train, visualize, export])
def test_help_lists_verbose(program, capsys):
    with pytest.raises(SystemExit) as exit_info:
        program.main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--verbose show TensorFlow's start-up logs" in text

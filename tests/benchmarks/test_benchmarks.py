"""The measuring programs (benchmarks/) and the examples (examples/) at the repository root:
each program answers `--help` under its command's name, a program started in a new process
finds the package from any folder, no program edits `sys.path`, and neither folder is shipped
in the batchrl distribution."""

import importlib
import subprocess
import sys
import tomllib

import pytest

from benchmarks import ROOT, child_environment

# (module with `main(argv)`, leading arguments, the command's name in its usage line).
PROGRAMS = [
    ("benchmarks.throughput.__main__", [], "python -m benchmarks.throughput"),
    ("benchmarks.throughput.__main__", ["breakdown"], "python -m benchmarks.throughput breakdown"),
    ("benchmarks.speed", ["update"], "python -m benchmarks.speed update"),
    ("benchmarks.speed", ["training"], "python -m benchmarks.speed training"),
    ("benchmarks.faults.injection", [], "python -m benchmarks.faults"),
    ("benchmarks.ray_scaling", [], "python -m benchmarks.ray_scaling"),
    ("benchmarks.off_policy", [], "python -m benchmarks.off_policy"),
]


@pytest.mark.parametrize("module, argv, command", PROGRAMS, ids=lambda item: str(item))
def test_each_program_answers_help(module, argv, command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(module).main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {command} ")


def test_a_new_process_finds_the_package_from_another_folder(tmp_path):
    command = [sys.executable, "-m", "benchmarks.faults", "--help"]
    result = subprocess.run(command, cwd=tmp_path, env=child_environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m benchmarks.faults ")


def test_no_program_edits_sys_path():
    sources = [*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("examples/*.py")]
    assert len(sources) >= 15
    assert [str(path) for path in sources if "sys.path" in path.read_text()] == []


def test_benchmarks_and_examples_are_not_shipped():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]
    assert [name for name in packages if name.split(".")[0] != "batchrl"] == []
    assert not (ROOT / "scripts").exists()  # Its programs moved to benchmarks/ and examples/.

"""What `pip install .` ships: every package of the source tree, and the configs."""

import pathlib
import tomllib

from batchrl import configs

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_of_the_source_tree():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(path.parent.relative_to(ROOT).parts)
             for path in (ROOT / "batchrl").rglob("__init__.py")}
    assert set(setuptools["packages"]) - {"batchrl._configs"} == found
    assert setuptools["package-dir"]["batchrl._configs"] == "configs"


def test_configs_are_found_in_the_source_tree():
    assert configs.CONFIG_DIR == ROOT / "configs"
    assert "pendulum" in configs.available()


def test_console_scripts_are_the_commands(capsys):
    """Each entry point resolves to a command whose --help names its module."""
    import importlib

    import pytest

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"batchrl-train", "batchrl-visualize", "batchrl-export",
                            "batchrl-tune", "batchrl-plot", "batchrl-benchmark"}
    for name, target in scripts.items():
        module, function = target.split(":")
        with pytest.raises(SystemExit) as exit_info:
            getattr(importlib.import_module(module), function)(["--help"])
        assert exit_info.value.code == 0, name
        assert module in capsys.readouterr().out, name

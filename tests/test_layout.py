"""The package's floors (DESIGN.md, Layout): no import runs back up a floor, and every
environment lives in `batchrl/environments/`."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1] / "batchrl"
# The floor of each part of the package (a part: a subpackage, or a module of the front).
FLOORS = {"errors": 0, "_lazy": 0, "tools": 1, "spaces": 1, "environments": 2, "envs": 2,
          "drivers": 2, "networks": 2, "memories": 2, "optimizers": 2, "algorithms": 3,
          "distributed": 4, "scripts": 5}
FRONT = 4  # configs, build, agent, export, __init__.
# The parts above its floor that a file may name: DESIGN.md's first names of the drivers
# and environments (`tools.simulate`, `tools.Loop`, `tools.BatchEnv`, ...) and their old
# module paths, exported lazily by name.
ALIASES = {"tools/__init__.py": {"drivers", "environments"}}
# A string that names a module of batchrl (lazy exports and moved modules import by name).
_MODULE_NAME = re.compile(r"batchrl(\.\w+)+")


def _part(path):
    relative = path.relative_to(ROOT)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _floor(part):
    return FLOORS.get(part, FRONT)


def _imported_parts(path):
    """The parts of batchrl that `path` imports (at any depth of the file), also by a
    module's name in a string."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if _MODULE_NAME.fullmatch(node.value) else []
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "batchrl" and len(pieces) > 1:
                parts.add(pieces[1])
    return parts


def test_no_import_runs_back_up_a_floor():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        part = _part(path)
        allowed = ALIASES.get(path.relative_to(ROOT).as_posix(), set())
        for imported in _imported_parts(path) - {part} - allowed:
            if _floor(imported) > _floor(part):
                upward.append(f"{path.relative_to(ROOT)} imports batchrl.{imported}")
    assert upward == []


def test_tools_holds_no_environment():
    names = {path.stem for path in (ROOT / "tools").glob("*.py")}
    assert not {name for name in names if "env" in name}, names
    assert not any("gymnasium.Env" in path.read_text() and "class " in path.read_text()
                   and "(gymnasium.Env)" in path.read_text()
                   for path in (ROOT / "tools").glob("*.py"))


def test_tests_mirror_the_package():
    """tests/ mirrors the package: a folder of tests per subpackage of batchrl (and for the
    repository's benchmarks/ and examples/); the tests of the front's modules and of the
    whole package at the top."""
    tests = pathlib.Path(__file__).resolve().parent
    folders = {path.name for path in tests.iterdir()
               if path.is_dir() and any(path.glob("test_*.py"))}
    rooms = {path.name for path in ROOT.iterdir() if (path / "__init__.py").exists()}
    assert folders <= rooms | {"benchmarks", "examples"}, folders - rooms
    assert not {f"test_{room}.py" for room in rooms} & {path.name for path in tests.glob("*.py")}
    for folder in folders:
        assert (tests / folder / "__init__.py").exists(), folder

"""`batchrl._lazy`: lazy exports (a name imported on first use, itself beside a submodule
of its name, submodules by name) and moved modules (an old path gives the new module
itself); and no package of batchrl exports by other means."""

import ast
import importlib
import pathlib
import sys
import warnings

import pytest

from batchrl import _lazy


def test_an_old_path_imports_the_new_module_with_a_deprecation_warning():
    _lazy.moved_modules({"batchrl.test_lazy_old_errors": "batchrl.errors"})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            old = importlib.import_module("batchrl.test_lazy_old_errors")
            from batchrl.test_lazy_old_errors import ConfigError
        new = importlib.import_module("batchrl.errors")
        assert old is new and ConfigError is new.ConfigError
        assert new.__spec__.name == "batchrl.errors"  # Not replaced by the old name's.
        assert [warning.category for warning in caught] == [DeprecationWarning]
        assert "moved to batchrl.errors" in str(caught[0].message)
    finally:
        _lazy._FINDER.moves.pop("batchrl.test_lazy_old_errors")
        sys.modules.pop("batchrl.test_lazy_old_errors", None)
        import batchrl
        vars(batchrl).pop("test_lazy_old_errors", None)


_PACKAGE = "test_lazy_scratch_package"


@pytest.fixture
def scratch_package(tmp_path, monkeypatch):
    """A package on disk whose `__init__` exports `thing` (the function of `thing.py`) with
    `_lazy.exports`; `other.py` is a submodule and `broken.py` lacks a dependency. Yields a
    function that imports it with `submodules` on or off."""
    root = tmp_path / _PACKAGE
    root.mkdir()
    (root / "thing.py").write_text("def thing():\n    return 'thing'\n")
    (root / "other.py").write_text("VALUE = 3\n")
    (root / "broken.py").write_text("import test_lazy_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # `__init__` is rewritten.

    def load(submodules):
        (root / "__init__.py").write_text(
            "from batchrl import _lazy\n"
            f"__getattr__ = _lazy.exports(__name__, {{'thing': '{_PACKAGE}.thing'}}, "
            f"submodules={submodules})\n")
        for name in [name for name in sys.modules if name.split(".")[0] == _PACKAGE]:
            del sys.modules[name]
        importlib.invalidate_caches()
        return importlib.import_module(_PACKAGE)

    yield load
    for name in [name for name in sys.modules if name.split(".")[0] == _PACKAGE]:
        del sys.modules[name]


def test_an_exported_name_stays_itself_beside_its_submodule(scratch_package):
    package = scratch_package(submodules=False)
    assert f"{_PACKAGE}.thing" not in sys.modules  # Not imported before its first use.
    module = importlib.import_module(f"{_PACKAGE}.thing")  # Sets it on its package.
    first = package.thing
    assert first is module.thing and first() == "thing"
    assert package.thing is first
    package.thing = len  # Any other value is set as usual.
    assert package.thing is len


def test_submodules_are_reached_by_name_only_when_asked(scratch_package):
    package = scratch_package(submodules=False)
    with pytest.raises(AttributeError, match=f"module '{_PACKAGE}' has no attribute 'other'"):
        package.other  # noqa: B018
    package = scratch_package(submodules=True)
    assert package.other is sys.modules[f"{_PACKAGE}.other"] and package.other.VALUE == 3
    with pytest.raises(AttributeError, match=f"module '{_PACKAGE}' has no attribute 'nothing'"):
        package.nothing  # noqa: B018


def test_a_missing_dependency_of_a_submodule_is_not_a_missing_name(scratch_package):
    package = scratch_package(submodules=True)
    with pytest.raises(ModuleNotFoundError) as caught:
        package.broken  # noqa: B018
    assert caught.value.name == "test_lazy_no_such_dependency"


ROOT = pathlib.Path(__file__).resolve().parents[2] / "batchrl"


def _own_lazy_mechanisms(source):
    """The lines of `source` (a module's text) that export lazily by their own means: a
    module-level `__getattr__` other than `__getattr__ = _lazy.exports(...)`, or an
    `importlib` import in a package's `__init__`."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.name == "__getattr__":
            found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and target.id == "__getattr__"
                   for target in targets) and not _is_lazy_exports(node.value):
                found.append(node.lineno)
    return found


def _is_lazy_exports(value):
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "exports" and isinstance(value.func.value, ast.Name)
            and value.func.value.id == "_lazy")


def _imports_importlib(source):
    return any(isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "importlib"
                                                    for alias in node.names)
               or isinstance(node, ast.ImportFrom) and node.module
               and node.module.split(".")[0] == "importlib"
               for node in ast.walk(ast.parse(source)))


def test_every_package_exports_through_lazy_alone():
    """No module of batchrl writes its own module `__getattr__`, and no package's
    `__init__` imports by name itself (`_lazy` is the one mechanism)."""
    own = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "_lazy.py":
            continue
        lines = _own_lazy_mechanisms(path.read_text())
        if path.name == "__init__.py" and _imports_importlib(path.read_text()):
            lines.append("importlib")
        if lines:
            own[path.relative_to(ROOT).as_posix()] = lines
    assert own == {}


def test_the_source_check_finds_a_hand_written_getattr():
    """The check above on sources of known answers (it would pass on anything otherwise)."""
    assert _own_lazy_mechanisms("def __getattr__(name):\n    raise AttributeError\n") == [1]
    assert _own_lazy_mechanisms("__getattr__ = make(__name__)\n") == [1]
    assert _own_lazy_mechanisms("__getattr__ = _lazy.exports(__name__, {})\n") == []
    assert _own_lazy_mechanisms("class A:\n    def __getattr__(self, name):\n        pass\n") \
        == []
    assert _imports_importlib("def f():\n    import importlib\n")
    assert not _imports_importlib("from batchrl import _lazy\n")

"""Lazy exports and moved modules, the one mechanism of every package of batchrl: importing a
package starts nothing heavy (TensorFlow) until a name is used, an exported name stays
itself beside a submodule of its name, and a module's old import path keeps working for a
release after it moves."""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings


def exports(package, names, submodules=False):
    """The module `__getattr__` of `package` (its `__name__`), every package's one way to
    export lazily: `__getattr__ = _lazy.exports(__name__, {"Loop": "batchrl.drivers.loop"})`.

    Each of `names` (dict name -> absolute module name) is imported from its module on first
    access and kept in the package; it stays that object where a submodule has the same name
    (`keep_exports`). With `submodules`, any other name is the package's submodule of that
    name (or a moved module's old path, `moved_modules`), imported on first access. Raises
    AttributeError naming the package and the name for anything else; an error inside a
    module being imported propagates as it is (a missing dependency is not a missing name).
    """
    keep_exports(package, names)

    def __getattr__(name):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif submodules and not name.startswith("__"):
            module_name = f"{package}.{name}"
            try:
                value = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                if error.name != module_name:
                    raise
                raise AttributeError(
                    f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def keep_exports(package, names):
    """Keeps each of `names` (exported names of `package`, its `__name__`) the exported
    object where a submodule has the same name: the import system sets an imported
    submodule as an attribute of its package, which would replace the name (e.g.
    `drivers.simulate`, the function, by `drivers/simulate.py`). Setting any other value
    works as usual. `exports` calls it."""
    kept = frozenset(names)

    class Package(types.ModuleType):
        """A package whose kept names no submodule import replaces."""

        def __setattr__(self, name, value):
            if name in kept and isinstance(value, types.ModuleType):
                return
            super().__setattr__(name, value)

    sys.modules[package].__class__ = Package


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module's old name as its new module (the same module object), with a
    DeprecationWarning naming the new path."""

    def __init__(self):
        self.moves = {}
        # The new modules' own specs, which the import under the old name replaces.
        self._specs = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.moves:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = self.moves[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # The new module ran when it was imported; give it back its own spec.
        module.__spec__ = self._specs.pop(module.__spec__.name)


_FINDER = _MovedModuleFinder()


def moved_modules(moves):
    """Keeps old module paths importable: `moves` maps an old dotted name to the new one
    (`{"batchrl.algorithms.replay": "batchrl.memories.replay"}`). Importing the old name
    gives the new module itself (`import old` and `from old import name` both work) and a
    DeprecationWarning. Call from the package that held the old modules (its `__init__`)."""
    _FINDER.moves.update(moves)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)

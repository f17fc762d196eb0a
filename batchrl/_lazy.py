"""Lazily imported names of a package, so that importing the package starts nothing heavy
(TensorFlow) until a name is used."""

import importlib


def exports(package, names):
    """The module `__getattr__` of `package` (its `__name__`) that imports each of `names`
    (dict name -> module) from its module on first access and keeps it in the package."""
    import sys

    def __getattr__(name):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

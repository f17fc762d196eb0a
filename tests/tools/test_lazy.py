"""`batchrl._lazy.moved_modules`: an old module path gives the new module itself."""

import importlib
import sys
import warnings

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

"""The old paths of the modules that left `batchrl/tools/` (for `batchrl/drivers/`,
`batchrl/environments/` and `batchrl/spaces/`) import the new modules themselves, and
`batchrl.tools`' names stay what DESIGN.md says."""

import importlib
import sys
import warnings

import pytest

from tests.fresh_process import check_in_fresh_process

MOVES = {
    "batchrl.tools.loop": "batchrl.drivers.loop",
    "batchrl.tools.nested": "batchrl.spaces.nested",
    "batchrl.tools.numpy_function": "batchrl.environments.numpy_function",
    "batchrl.tools.simulate": "batchrl.drivers.simulate",
    "batchrl.tools.wrappers": "batchrl.environments.wrappers",
}


@pytest.mark.parametrize("old, new", sorted(MOVES.items()))
def test_an_old_path_imports_the_new_module_with_a_deprecation_warning(old, new):
    sys.modules.pop(old, None)  # Imported anew, so that it warns here.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new
    assert [str(warning.message) for warning in caught
            if warning.category is DeprecationWarning] == [
        f"{old} moved to {new}; the old path goes in the next release"]


def test_names_imported_from_an_old_path_are_the_new_modules_names():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from batchrl.tools.loop import EnvironmentFailed, Interrupted, Loop, PhaseResult
        from batchrl.tools.numpy_function import keep_python_thread_state
        from batchrl.tools.simulate import act, episode_state, simulate, simulate_steps
    from batchrl import drivers
    from batchrl.drivers import simulate as exported
    from batchrl.environments import numpy_function

    assert (Loop, EnvironmentFailed, Interrupted, PhaseResult) == (
        drivers.Loop, drivers.EnvironmentFailed, drivers.Interrupted, drivers.PhaseResult)
    assert (simulate, simulate_steps, episode_state) == (
        drivers.simulate, drivers.simulate_steps, drivers.episode_state)
    assert act is sys.modules["batchrl.drivers.simulate"].act
    assert exported is simulate  # The function, not its module.
    assert keep_python_thread_state is numpy_function.keep_python_thread_state


_CHECK = """
import inspect, sys, types, warnings
warnings.simplefilter("ignore", DeprecationWarning)
import batchrl.tools.simulate, batchrl.tools.loop
from batchrl.tools.simulate import simulate_steps
from batchrl import drivers, tools
for _ in range(3):
    assert inspect.isfunction(tools.simulate), tools.simulate
    assert tools.simulate is drivers.simulate is sys.modules["batchrl.drivers.simulate"].simulate
    assert tools.Loop is drivers.Loop and inspect.isclass(tools.MockAlgorithm)
    assert tools.loop is sys.modules["batchrl.drivers.loop"], tools.loop
"""


def test_tools_simulate_stays_the_function_after_its_old_module_path_is_imported():
    """In a fresh process, where the old paths were imported first."""
    check_in_fresh_process(_CHECK)

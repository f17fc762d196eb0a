"""Every public name of DESIGN.md is the documented object on every access."""

import inspect
import sys

import pytest

from tests.fresh_process import check_in_fresh_process

_CHECK = """
import inspect, sys, types
{prelude}
import batchrl
from batchrl import drivers, tools
for package in (tools, drivers):
    for name in package.__all__:
        for _ in range(3):
            value = getattr(package, name)
            assert not isinstance(value, types.ModuleType), (name, value)
            assert inspect.isclass(value) or inspect.isfunction(value), (name, value)
            assert value.__name__ == name, (name, value)
assert inspect.isclass(batchrl.Agent) and batchrl.Agent is batchrl.Agent
"""


@pytest.mark.parametrize("prelude", [
    "",
    # Both forms of import load a submodule of a name's own name (`drivers.simulate`, whose
    # loading sets the package's attribute) before the name is read: one process for both.
    "from batchrl.drivers.simulate import simulate_steps\n"
    "import batchrl.drivers.simulate, batchrl.drivers.loop, batchrl.tools.streaming",
])
def test_exported_names_stay_what_they_are(prelude):
    """In a fresh process, also after the submodules of the same names were imported."""
    check_in_fresh_process(_CHECK.format(prelude=prelude))


def test_importing_the_package_does_not_import_tensorflow_or_ray():
    code = ("import sys, batchrl, batchrl.tools, batchrl.algorithms, batchrl.optimizers, "
            "batchrl.environments, batchrl.drivers; "
            "from batchrl.spaces import nested; "
            "from batchrl.environments import nested_tasks, wrappers, ray; "
            "from batchrl.environments.ray import driver; "
            "from batchrl import configs; "
            "e = batchrl.environments; e.create_batch, e.BatchEnv, e.local; "
            "configs.load('pendulum_trpo'); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    check_in_fresh_process(code)


def test_environments_reach_their_classes_makes_names_and_submodules():
    """`environments.X` is what DESIGN.md and `environments/__init__` promise: each class of
    `__all__` from its module, every public name of `make` (what a config's environments
    are made with), and a submodule by its name."""
    from batchrl import environments
    from batchrl.environments import make

    for name in environments.__all__:
        value = getattr(environments, name)
        assert inspect.isclass(value) and value.__name__ == name, (name, value)
        assert sys.modules[value.__module__].__dict__[name] is value
    public = [name for name, value in vars(make).items() if not name.startswith("_")
              and (getattr(value, "__module__", None) == make.__name__ or name.isupper())]
    assert {"create_batch", "episode_limit", "ENVPOOL_PREFIX"} <= set(public)
    for name in public:
        assert getattr(environments, name) is getattr(make, name), name
    assert environments.local is sys.modules["batchrl.environments.local"]
    assert environments.mock.MockEnvironment is environments.MockEnvironment

"""The networks' modules moved into `batchrl/networks/`: each old path imports the new module
itself (with a DeprecationWarning), and every name of the old `batchrl.networks` module is
still reached as `batchrl.networks.NAME`."""

import importlib
import sys

import pytest

from batchrl import _lazy
from tests.fresh_process import check_in_fresh_process

MOVES = {
    "batchrl.network_spec": "batchrl.networks.spec",
    "batchrl.torso": "batchrl.networks.torso",
    "batchrl.policies": "batchrl.networks.policies",
    "batchrl.algorithms.distributions": "batchrl.networks.distributions",
    "batchrl.algorithms.q_networks": "batchrl.networks.q_networks",
}
# The public names of the module `batchrl.networks` before it became a package, with the
# module that holds each now.
OLD_NAMES = {
    "batchrl.networks.constructors": [
        "NETWORKS", "Networks", "constructor", "declared", "feed_forward_categorical",
        "feed_forward_composite", "feed_forward_gaussian", "is_declared", "preset_layers",
        "recurrent_gaussian", "torso_factory"],
    "batchrl.networks.policies": [
        "CategoricalPolicy", "CompositePolicy", "GaussianPolicy", "RecurrentGaussianPolicy",
        "ValueNetwork"],
    "batchrl.networks.mlp": ["dense_layers"],
    "batchrl.networks.torso": ["RecurrentTorso", "Torso"],
    "batchrl.networks.distributions": [
        "Bernoulli", "Categorical", "Composite", "DiagonalGaussian", "MultiCategorical"],
}


@pytest.mark.parametrize("old, new", sorted(MOVES.items()))
def test_an_old_path_imports_the_new_module(old, new):
    import batchrl.algorithms  # noqa: F401  (registers the moves out of algorithms/)

    assert _lazy._FINDER.moves[old] == new
    sys.modules.pop(old, None)  # An earlier test may have imported it.
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new


def test_old_from_imports_give_the_new_modules():
    """In a fresh process, the `from package import module` forms of the old paths."""
    code = (
        "import warnings; warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from batchrl import network_spec, policies, torso\n"
        "from batchrl.algorithms import distributions, q_networks\n"
        "from batchrl.network_spec import check_layers\n"
        "from batchrl.algorithms.q_networks import TwinQ\n"
        "import batchrl.networks as n\n"
        "from batchrl.networks import spec\n"
        "assert network_spec is spec and check_layers is spec.check_layers\n"
        "assert policies is n.policies and torso is n.torso\n"
        "assert distributions is n.distributions and q_networks is n.q_networks\n"
        "assert TwinQ is n.q_networks.TwinQ\n")
    check_in_fresh_process(code)


def test_the_old_networks_module_names_are_reached_on_the_package():
    import batchrl.networks

    for module, names in OLD_NAMES.items():
        holder = importlib.import_module(module)
        for name in names:
            assert getattr(batchrl.networks, name) is getattr(holder, name), name
    assert sorted(batchrl.networks.__all__) == sorted(sum(OLD_NAMES.values(), []))


def test_importing_the_package_and_the_layer_checks_does_not_import_tensorflow():
    code = ("import sys, batchrl.networks; from batchrl.networks import spec; "
            "import batchrl.network_spec; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'")
    check_in_fresh_process(code, "-W", "ignore::DeprecationWarning")

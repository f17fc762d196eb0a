"""The memories moved from `batchrl.algorithms` to `batchrl.memories`: each old module path
gives the new module itself, with a DeprecationWarning, and the new package starts no
TensorFlow when imported."""

import importlib

import pytest

from batchrl import algorithms, memories
from tests.fresh_process import check_in_fresh_process

MOVES = {
    "batchrl.algorithms.memory": "batchrl.memories.episode",
    "batchrl.algorithms.observation_storage": "batchrl.memories.observation_storage",
    "batchrl.algorithms.replay": "batchrl.memories.replay",
    "batchrl.algorithms.sum_tree": "batchrl.memories.sum_tree",
}
# In this process only the first import of an old path warns; the fresh process checks it.
_MOVED_WARNING = "ignore:batchrl.algorithms.*moved to batchrl.memories:DeprecationWarning"


@pytest.mark.filterwarnings(_MOVED_WARNING)
@pytest.mark.parametrize("old, new", sorted(MOVES.items()))
def test_an_old_path_is_the_new_module(old, new):
    module = importlib.import_module(new)
    assert importlib.import_module(old) is module
    assert module.__name__ == new and module.__spec__.name == new
    package, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(package), name) is module


@pytest.mark.filterwarnings(_MOVED_WARNING)
def test_old_names_are_the_new_objects():
    from batchrl.algorithms.memory import EpisodeMemory
    from batchrl.algorithms.observation_storage import ObservationStorage
    from batchrl.algorithms.replay import FIELDS, PRIORITIZED_DEFAULTS, ReplayMemory
    from batchrl.algorithms.sum_tree import SumTree

    assert algorithms.ReplayMemory is memories.ReplayMemory is ReplayMemory
    assert (EpisodeMemory, ObservationStorage, SumTree) == (
        memories.EpisodeMemory, memories.ObservationStorage, memories.SumTree)
    assert FIELDS == ("observ", "action", "reward", "discount", "nextob")
    assert PRIORITIZED_DEFAULTS == {"alpha": 0.6, "beta": 0.4, "epsilon": 1e-6}


_FRESH = """
import importlib, sys, warnings
import batchrl.memories
assert "tensorflow" not in sys.modules, "importing batchrl.memories imported tensorflow"
moves = {moves!r}
for old, new in sorted(moves.items()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is sys.modules[new], old
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert messages == [f"{{old}} moved to {{new}}; the old path goes in the next release"], (
        old, messages)
"""


def test_in_a_fresh_process_each_old_path_warns_once_and_memories_starts_no_tensorflow():
    check_in_fresh_process(_FRESH.format(moves=MOVES))

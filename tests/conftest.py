import logging
import os
import pathlib

import pytest

from batchrl.scripts import compile_cache

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's programs compiled by the tests, in this process (TensorFlow is not imported yet)
# and in the training commands they start, are kept here, not in the user's ~/.cache
# (`batchrl.scripts.compile_cache`); both pytest-xdist workers share it.
os.environ.setdefault("BATCHRL_XLA_CACHE", str(
    pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "batchrl-xla"))
compile_cache.enable()


# Modules that start Ray clusters: run one after the other on the same worker under
# pytest-xdist, so that two clusters never share the two cores.
_RAY_MODULES = {"test_batch_env_contract", "test_ray_benchmark", "test_ray_env"}


def pytest_collection_modifyitems(config, items):
    """Groups the tests for `pytest -n 2 --dist loadgroup` (the Makefile's `test`): each
    module runs whole on one worker, so its module-scoped fixtures (training runs, Ray
    clusters) are built once; the Ray modules share one group."""
    for item in items:
        name = item.module.__name__.rpartition(".")[2]
        group = "ray" if name in _RAY_MODULES else name
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config):
    # Many training runs share this process's TensorFlow, whose inter-op threads are fixed
    # once it runs: the warning that a run's setting is not applied is expected here.
    config.addinivalue_line(
        "filterwarnings", "ignore:inter_op_threads.*not applied:UserWarning")


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray cluster of two nodes on this machine (two CPUs each; `ray.cluster_utils`), this
    process connected to it, shut down at the end of the test module (its idle processes
    would take CPU from the other modules' tests). Its processes see the repository on
    PYTHONPATH, so actors can build `benchmarks.faults.envs` environments. Skips without
    Ray (`pip install 'batchrl[ray]'`)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    root = str(pathlib.Path(__file__).resolve().parents[1])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, previous]))
    try:
        node = {"num_cpus": 2, "object_store_memory": 100 * 2**20}
        cluster = Cluster(initialize_head=True,
                          head_node_args={**node, "include_dashboard": False})
        cluster.add_node(**node)
        cluster.wait_for_nodes()
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous
    ray.init(address=cluster.address, logging_level=logging.ERROR)
    yield cluster
    ray.shutdown()
    cluster.shutdown()

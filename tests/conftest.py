import logging
import os
import pathlib

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config):
    # Many training runs share this process's TensorFlow, whose inter-op threads are fixed
    # once it runs: the warning that a run's setting is not applied is expected here.
    config.addinivalue_line(
        "filterwarnings", "ignore:inter_op_threads.*not applied:UserWarning")


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray cluster of two nodes on this machine (two CPUs each; `ray.cluster_utils`), this
    process connected to it, shut down at the end of the test module (its idle processes
    would take CPU from the other modules' tests). Its processes see
    scripts/ on PYTHONPATH, so actors can build `fault_envs` environments. Skips without
    Ray (`pip install 'batchrl[ray]'`)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    scripts = str(pathlib.Path(__file__).resolve().parents[1] / "scripts")
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [scripts, previous]))
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

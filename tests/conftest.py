import logging
import os
import pathlib

import pytest

from batchrl.scripts import compile_cache, train

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's programs compiled by the tests, in this process (TensorFlow is not imported yet)
# and in the training commands they start, are kept here, not in the user's ~/.cache
# (`batchrl.scripts.compile_cache`); both pytest-xdist workers share it.
os.environ.setdefault("BATCHRL_XLA_CACHE", str(
    pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "batchrl-xla"))
compile_cache.enable()

# The tests build many small graphs that each run a few times: Grappler's passes took
# about 2/3 of a function's first call and saved less than they cost. Training keeps them
# unless BATCHRL_GRAPPLER is off (`batchrl.scripts.train.grappler_off`), as it is here, in
# this process and in the commands the tests start (about 3 s sooner ready each).
# BATCHRL_GRAPPLER=on runs the suite with Grappler.
os.environ.setdefault("BATCHRL_GRAPPLER", "off")


def _op_tracebacks_off():
    """Stops TensorFlow from recording, for each graph op it builds, the Python stack that
    built it (`tf_stack.extract_stack`, which walks every frame: deep under pytest and
    `tf.function`'s tracing). The record only serves TensorFlow's runtime error messages
    ("defined at ..."); the graphs and their results are the same. Tracing took 469 of the
    test workers' 1,090 CPU-s, 78 s of it in that walk (py-spy, 2026-12-04); test_ppo.py +
    test_loop.py took 0.76 of the time without it (two interleaved pairs, 78.5/59.7 s and
    72.9/55.2 s). This process only: the commands the tests start keep theirs (8 s of
    their 527 CPU-s). BATCHRL_OP_TRACEBACKS=on keeps them, for a failing test whose graph
    error needs them. TensorFlow's `_create_c_op` takes `extract_traceback` (default True)
    and no caller passes it: its default is set."""
    if os.environ.get("BATCHRL_OP_TRACEBACKS", "off").strip().lower() in ("on", "1", "true"):
        return
    from tensorflow.python.framework import ops

    create = ops._create_c_op.__wrapped__  # Under TensorFlow's traceback filter.
    names = create.__code__.co_varnames[:create.__code__.co_argcount]
    if names[-1] != "extract_traceback" or create.__defaults__[-1] is not True:
        raise RuntimeError("TensorFlow's _create_c_op changed: tests/conftest.py's "
                           "_op_tracebacks_off needs a look")
    create.__defaults__ = (*create.__defaults__[:-1], False)


def _configure_tensorflow():
    """Imports TensorFlow (after the XLA flags above) and sets it up for the tests."""
    import tensorflow as tf

    if train.grappler_off():
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    _op_tracebacks_off()
    # One thread per op in this process: the two pytest-xdist workers (and the commands
    # they start) share two cores, and the tests' small ops gain nothing from a second
    # thread. Interleaved A/B, test_ppo + test_agent + test_off_policy + test_replay under
    # -n 2, four rounds against TensorFlow's default: wall time 0.92, 0.94, 0.92, 0.99; CPU
    # 0.94-0.98. The training commands the tests start keep TensorFlow's default.
    tf.config.threading.set_intra_op_parallelism_threads(1)


def _is_xdist_controller(config):
    """Whether this process only hands tests to pytest-xdist's workers (`pytest -n 2`): it
    runs none, so it needs no TensorFlow (~5 s of `import tensorflow` before the workers
    start)."""
    return bool(getattr(config.option, "numprocesses", None)) and (
        "PYTEST_XDIST_WORKER" not in os.environ)


# Modules that start Ray clusters: run one after the other on the same worker under
# pytest-xdist, so that two clusters never share the two cores.
_RAY_MODULES = {"test_batch_env_contract", "test_ray_benchmark", "test_ray_env", "test_on_ray"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Schedules the tests of `pytest -n 2` (the Makefile's `test`) by module: each module
    runs whole on one worker, so that its module-scoped fixtures (training runs, benchmark
    runs) are built once, and the Ray modules share one unit. pytest-xdist 3.8's own
    `--dist loadgroup` cannot do this under pytest 9 (it marks a group by rewriting the
    test's nodeid, which pytest 9 no longer reads), and `--dist loadscope` would let two
    Ray modules run at once."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return "ray" if pathlib.Path(module).stem in _RAY_MODULES else module

    # The modules in the order `pytest_collection_modifyitems` gives (longest first), not
    # xdist's own (most tests first).
    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)


# The longest modules (seconds of `pytest --durations=0 -n 2` from a fresh clone,
# 2026-12-03: the Ray modules, one unit, ~170 s; then 86 s down to 18 s), started first: a
# long module that starts last keeps one worker busy while the other idles. The others
# follow in collection order.
_LONGEST_FIRST = (
    "distributed/test_on_ray.py", "scripts/test_train.py", "distributed/test_fragment.py",
    "algorithms/test_ppo.py", "scripts/test_compile_cache.py", "test_agent.py",
    "distributed/test_apex.py", "benchmarks/test_throughput_benchmark.py",
    "algorithms/test_learning.py", "algorithms/test_off_policy.py", "scripts/test_tune.py",
    "algorithms/test_actor.py", "scripts/test_eager.py", "drivers/test_loop.py",
    "algorithms/test_off_policy_learning.py", "examples/test_dqn_example.py",
    "algorithms/test_ppo_data_flow.py", "distributed/test_collective.py",
    "scripts/test_nested_commands.py", "test_export_conversion.py",
    "benchmarks/test_fault_injection.py")


def pytest_collection_modifyitems(items):
    """Puts the modules of `_LONGEST_FIRST` first, in its order; a module's tests keep
    their order (its module fixtures are built once).

    Raises:
      pytest.UsageError: a name of `_LONGEST_FIRST` is not a file under tests/ (renamed).
    """
    tests = pathlib.Path(__file__).resolve().parent
    missing = [name for name in _LONGEST_FIRST if not (tests / name).is_file()]
    if missing:
        raise pytest.UsageError(f"_LONGEST_FIRST of tests/conftest.py names no module: "
                                f"{', '.join(missing)}")
    rank = {str(tests / name): index for index, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


def pytest_configure(config):
    if not _is_xdist_controller(config):
        _configure_tensorflow()
    # Many training runs share this process's TensorFlow, whose inter-op threads are fixed
    # once it runs: the warning that a run's setting is not applied is expected here.
    config.addinivalue_line(
        "filterwarnings", "ignore:inter_op_threads.*not applied:UserWarning")


_CLUSTER = []  # The test cluster of `ray_cluster`, while the Ray modules run.


@pytest.fixture
def ray_cluster():
    """A Ray cluster of two nodes on this machine (two CPUs each; `ray.cluster_utils`; no
    idle workers started ahead of need, as a local Ray of batchrl's), this process connected
    to it. Started by the first test that asks for it and shared by the
    Ray modules (`_RAY_MODULES`, which run one after the other); shut down after the last
    test of theirs (`pytest_runtest_teardown`): its idle processes would take CPU from the
    other modules' tests. Its processes see the repository on PYTHONPATH, so actors can
    build `benchmarks.faults.envs` environments. Skips without Ray
    (`pip install 'batchrl[ray]'`)."""
    ray = pytest.importorskip("ray")
    if _CLUSTER:
        return _CLUSTER[0]
    from ray.cluster_utils import Cluster

    from batchrl.environments.ray.connection import LOCAL_SYSTEM_CONFIG

    root = str(pathlib.Path(__file__).resolve().parents[1])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, previous]))
    try:
        node = {"num_cpus": 2, "object_store_memory": 100 * 2**20}
        cluster = Cluster(initialize_head=True,
                          head_node_args={**node, "include_dashboard": False,
                                          "_system_config": LOCAL_SYSTEM_CONFIG})
        cluster.add_node(**node)
        cluster.wait_for_nodes()
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous
    ray.init(address=cluster.address, logging_level=logging.ERROR)
    _CLUSTER.append(cluster)
    return cluster


def pytest_runtest_teardown(item, nextitem):
    """Shuts the test cluster down after the last test of the Ray modules: when the next
    test is of another module, or there is none (the scheduling sends the Ray modules to
    one worker as one unit, `pytest_xdist_make_scheduler`)."""
    if _CLUSTER and (nextitem is None or nextitem.path.stem not in _RAY_MODULES):
        import ray

        ray.shutdown()
        _CLUSTER.pop().shutdown()

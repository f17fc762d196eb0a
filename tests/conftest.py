import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config):
    # Many training runs share this process's TensorFlow, whose inter-op threads are fixed
    # once it runs: the warning that a run's setting is not applied is expected here.
    config.addinivalue_line(
        "filterwarnings", "ignore:inter_op_threads.*not applied:UserWarning")

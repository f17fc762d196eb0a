"""Learners that share the update (`batchrl.distributed.collective`): two learner processes,
each learning from its own fragments with their gradients averaged and their normalizers'
statistics added on TensorFlow's collective all-reduce, end with the weights and statistics
of one learner that learned from the union of each update's two fragments."""

import os
import subprocess
import sys

import numpy as np
import pytest

from batchrl import configs
from batchrl.algorithms import IMPALA
from batchrl.distributed.fragment import expand
from batchrl.distributed.learners import free_ports
from tests.distributed import test_fragment

UPDATES = 3  # Per learner: each update takes one fragment on each of the two.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config():
    # Plain SGD, unclipped: its step is proportional to the gradient, so that a sum in place
    # of the mean would show (Adam's step would hide a constant factor). Both normalizers
    # on: each learner adds the other's fragment to its statistics.
    return test_fragment._config(optimizer={"type": "sgd"}, policy_lr=0.05,
                                 max_gradient_norm=None, normalize_observ=True,
                                 normalize_reward=True)


def learner():
    """The test's IMPALA (3 rows of mock environments, seed 0's initial weights)."""
    return test_fragment._algorithm(_config(), IMPALA)


def load(path):
    """The fragments saved by `_save`, in order: list of dicts of NumPy arrays."""
    with np.load(path) as saved:
        count = 1 + max(int(key.split("/")[0]) for key in saved.files)
        fragments = [{} for _ in range(count)]
        for key in saved.files:
            index, name = key.split("/", 1)
            fragments[int(index)][name] = saved[key]
    return fragments


def _save(path, fragments):
    np.savez(path, **{f"{index}/{key}": value for index, fragment in enumerate(fragments)
                      for key, value in fragment.items()})


@pytest.mark.timeout(240)
def test_two_learners_step_as_one_learner_on_the_union_of_their_batches(tmp_path):
    config = _config()
    recorder, _, _ = test_fragment._recorder(config)
    fragments = [expand(recorder.collect()) for _ in range(2 * UPDATES)]
    path = tmp_path / "fragments.npz"
    _save(path, fragments)
    ports = ",".join(map(str, free_ports(2)))
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                       PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
                           "PYTHONPATH")])))
    workers = [subprocess.Popen(
        [sys.executable, "-m", "tests.distributed.collective_worker", str(index), ports,
         str(path), str(tmp_path / f"learner{index}.npz")],
        cwd=ROOT, env=environment, stderr=subprocess.PIPE, text=True) for index in range(2)]
    errors = [worker.communicate(timeout=200)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], errors

    union = learner()
    initial = [variable.numpy() for variable in union._joint_variables()]
    for update in range(UPDATES):
        pair = fragments[2 * update:2 * update + 2]
        union.learn({key: np.concatenate([fragment[key] for fragment in pair])
                     for key in pair[0]})
    want = [variable.numpy() for variable in union._joint_variables()]
    want += [variable.numpy() for variable in list(union._observ_filter.variables)
             + list(union._reward_filter.variables)]
    assert any(not np.allclose(a, b) for a, b in zip(want, initial, strict=True))
    for index in range(2):
        with np.load(tmp_path / f"learner{index}.npz") as saved:
            got = [saved[f"arr_{k}"] for k in range(len(saved.files))]
        for value, expected in zip(got, want, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)
    # Alone, a learner on its own fragments ends elsewhere: the mean is what makes them equal.
    alone = learner()
    for fragment in fragments[0::2]:
        alone.learn(fragment)
    assert any(not np.allclose(variable.numpy(), expected, atol=1e-4)
               for variable, expected in zip(alone._joint_variables(), want, strict=False))


def test_a_learner_whose_optimizer_does_not_step_on_gradients_says_so():
    algo = test_fragment._algorithm(configs.Config(_config(), optimizer={
        "type": "natural_gradient"}), IMPALA)
    with pytest.raises(ValueError, match="does not step on them"):
        algo.share_update(None)

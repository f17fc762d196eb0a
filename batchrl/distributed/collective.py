"""Learners that share the update (issue 61): the mean of every learner's gradients before
each step, on TensorFlow's own collective all-reduce (the engine of
`tf.distribute.MultiWorkerMirroredStrategy`: gRPC between the learner processes, the cluster
given by `TF_CONFIG`). Each learner computes the gradient of its own batch and steps on the
mean, so that M learners with equal batches step as one learner on their union
(`tests/distributed/test_collective.py`). The learners themselves, their actors and
`learners: M`: `batchrl.distributed.learners`; what one all-reduce costs here:
docs/scaling.md, `benchmarks.allreduce`."""

import json
import os
import zlib

import tensorflow as tf
from tensorflow.python.ops import collective_ops


class AllReduce:
    """Sums and means over the `learners` processes of the cluster, graph code: `mean` of a
    step's gradients (all packed into one float32 vector: one all-reduce) and `sum` of a
    tensor of any dtype (the normalizers' statistics). Every learner must make the same
    calls in the same order (the learners step in lock-step). Each call names what it
    reduces, and the name gives its collective instance key (a hash, so the same on every
    learner whatever else each process traced, e.g. a step function that holds the same
    update without running it).

    Args:
      learners: int >= 2, the processes of the cluster.
      device: str, this process's device of the cluster (`/job:worker/replica:0/task:I/...`).
      timeout: float seconds a learner waits for the others before its all-reduce fails
        (`tf.errors.DeadlineExceededError` or `UnavailableError`), or None: no bound.
    """

    def __init__(self, learners, device, timeout=None):
        self.learners = int(learners)
        self._device = device
        self._timeout = 0.0 if timeout is None else float(timeout)

    def _reduce(self, tensor, final_op, name):
        key = zlib.crc32(name.encode()) % (2 ** 30) + 1
        with tf.device(self._device):
            return collective_ops.all_reduce_v2(
                tensor, group_size=self.learners, group_key=1, instance_key=key,
                merge_op="Add", final_op=final_op, timeout=self._timeout)

    def sum(self, tensor, name):
        """`tensor` summed element-wise over the learners (its shape and dtype); `name`
        (str) says what it is, the same on every learner."""
        return self._reduce(tensor, "Id", name)

    def mean(self, gradients, name="gradients"):
        """`gradients` (list of float32 tensors, or None for a variable without one)
        averaged over the learners; None stays None. `name` as for `sum`."""
        present = [gradient for gradient in gradients if gradient is not None]
        if not present:
            return list(gradients)
        flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in present], 0)
        mean = self._reduce(flat, "Div", name)
        sizes = [g.shape.num_elements() if g.shape.is_fully_defined() else tf.size(g)
                 for g in present]
        parts = iter(tf.split(mean, sizes))
        return [None if gradient is None else tf.reshape(next(parts), tf.shape(gradient))
                for gradient in gradients]


def connect(addresses, index, timeout=None):
    """Makes this process learner `index` of the cluster of learner processes at
    `addresses` (list of "host:port", one per learner, in order; this one listens on its
    own): sets `TF_CONFIG` and starts TensorFlow's collective executor (a
    `MultiWorkerMirroredStrategy`), which waits for the others. Call it before TensorFlow
    runs anything else in the process.

    Returns:
      `AllReduce` for this process.
    """
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": int(index)}})
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return AllReduce(len(addresses), strategy.extended.worker_devices[0], timeout)

"""Reading scalar summaries back from a run's TensorBoard event files."""

import collections

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

Scalar = collections.namedtuple("Scalar", "step, wall_time, value")


def read_scalars(directory, tag):
    """The scalar summaries `tag` written by `tf.summary.scalar` under `directory`.

    Args:
      directory: a folder of event files, e.g. `RUN_DIR/eval`.
      tag: the summary tag, e.g. `mean_score`.

    Returns:
      list of `Scalar(step, wall_time, value)` sorted by step (wall_time in seconds since
      the epoch); empty when the tag was never written.
    """
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()["tensors"]:
        return []
    events = accumulator.Tensors(tag)
    values = [Scalar(event.step, event.wall_time,
                     float(tensor_util.make_ndarray(event.tensor_proto)))
              for event in events]
    return sorted(values, key=lambda scalar: scalar.step)

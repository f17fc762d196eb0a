"""What the PPO tests share: a full episode memory put into a PPO, so that its update runs
on given episodes without playing them (and tracing `simulate`)."""

import tensorflow as tf


def load_memory(algo, memory):
    """Fills `algo`'s episode memory (a PPO's) with `memory`: a dict of `episodes` (dict of
    `[rows, time, ...]` arrays), `length` (int32 `[rows]`), `final` (each episode's final
    observation) and `terminated` (bool `[rows]`); the memory then holds `rows` episodes."""
    rows = len(memory["length"])
    algo._memory.replace(memory["episodes"], memory["length"], tf.range(rows))
    algo._memory_final.assign(memory["final"])
    algo._memory_terminated.assign(memory["terminated"])
    algo._memory_index.assign(rows)

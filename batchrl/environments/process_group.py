"""The worker side of `ParallelBatchEnv`: a group of environments stepped over a fast channel,
with observations and actions in shared memory.

This module must stay free of TensorFlow: worker processes import it.

Protocol
--------
`ParallelBatchEnv` splits its `B` environments into `W` contiguous groups of nearly equal
size and starts one `ExternalProcess` worker per group, hosting an `EnvGroup` (not a
Gymnasium environment). Two channels connect the parent to each worker:

1. ExternalProcess's own pipe, for the life cycle: its `step` requests carry the group's
   set-up commands, so start-up, the worker's tracebacks, the report of a dead worker (exit
   code, signal) and shutdown are ExternalProcess's (see `batchrl.environments.wrappers`):

     `(BUILD,)`    build the environments; reply `{"pid": ..., "envs": [(observation_space,
                    action_space, id) per environment]}`, or a problem tuple (below)
     `(ATTACH, segment, size, layout, command_fifo, reply_fifo)`    map the shared memory
                    and open the worker's ends of the two FIFOs
     `(SERVE,)`    serve the fast channel until the parent closes it; the reply (None, or
                    the worker's traceback) is only read if the fast channel breaks

2. The fast channel, for stepping: two FIFOs (named pipes, made in a private temporary
   directory `batchrl-fifos-<parent pid>-*`, removed once both ends are open) carrying single
   bytes, with everything else in shared memory:

     parent -> worker  `b"s"`                        step each environment of the group
                       `b"r"` + 4-byte length + pickled `(local_indices, seed)`
                                                     reset those environments (env `i` with
                                                     seed `seed + i`, i a batch index)
     worker -> parent  `b"."`                        done, every environment succeeded
                       `b"!"` + 4-byte length + pickled problem tuple
                       end of file                   the worker died or stopped serving

   A problem tuple is `(RAISED, batch_index, pid, what, traceback)` for an exception of an
   environment (the group's other environments are still stepped) or `(BAD_SHAPE,
   batch_index, pid, shape, repr)` for an observation of the wrong shape.

One POSIX shared memory segment (`/dev/shm/batchrl-<parent pid>-<random>`), created and
unlinked by the parent, holds five arrays over the whole batch, each group using its rows:
`action` `[B, *action_shape]` in the action space's dtype (written by the parent),
`observ` float32 `[B, *observation_shape]`, `reward` float32 `[B]`, `terminated` and
`truncated` bool `[B]` (written by the workers). The parent writes `action` before it sends
the commands and reads the results only after every worker has replied, so no lock is
needed. Only the parent registers the segment with `multiprocessing`'s resource tracker (which
then removes it if the parent is killed). Workers map it with `shm_open` and `mmap` and never
register it: in Python 3.11 `SharedMemory(name)` registers the segment in every process that
attaches it, and a tracker of that process's own would unlink it, warning of a "leaked
shared_memory" object, when the process exits; unregistering it in a worker instead would
cancel the parent's registration wherever the tracker is shared (as with `forkserver`).
"""

import _posixshmem
import contextlib
import mmap
import os
import pickle
import traceback

import numpy as np

# Set-up commands: payloads of ExternalProcess `step` requests to an `EnvGroup`.
BUILD = "build"
ATTACH = "attach"
SERVE = "serve"

# Fast channel messages.
STEP = b"s"
RESET = b"r"
DONE = b"."
PROBLEM = b"!"

# Problems reported in replies.
RAISED = "raised"
BAD_SHAPE = "bad shape"

# Alignment of the arrays in the shared memory segment, in bytes (a cache line).
ALIGN = 64

ARRAYS = ("action", "observ", "reward", "terminated", "truncated")


class EnvGroup:
    """Worker side: the environments `first .. first + count - 1` of the batch.

    Hosted by an `ExternalProcess`, whose `step(command)` requests carry the set-up commands
    of the module docstring. Not an environment.
    """

    def __init__(self, constructor, first, count):
        self._constructor = constructor
        self._first = first
        self._count = count
        self._envs = []
        self._mapping = None
        self._command_fd = self._reply_fd = -1
        self._pid = os.getpid()

    def step(self, command):
        """Serves one set-up command (see the module docstring); returns the reply."""
        kind = command[0]
        if kind == BUILD:
            return self._build()
        if kind == ATTACH:
            return self._attach(*command[1:])
        if kind == SERVE:
            return self._serve()
        raise ValueError(f"unknown command {command!r}")

    def close(self):
        """Closes the environments (ignoring their errors), the channel and the memory."""
        for env in self._envs:
            with contextlib.suppress(Exception):
                env.close()
        self._envs = []
        for fd in (self._command_fd, self._reply_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._command_fd = self._reply_fd = -1
        for key in ARRAYS:
            self.__dict__.pop(key, None)
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            with contextlib.suppress(BufferError):
                mapping.close()

    def _build(self):
        described, failure = build_group(self._constructor, self._count, self._envs)
        if failure:
            j, what, text = failure
            return (RAISED, self._first + j, self._pid, what, text)
        return {"pid": self._pid, "envs": described}

    def _attach(self, segment_name, size, layout, command_fifo, reply_fifo):
        fd = _posixshmem.shm_open("/" + segment_name, os.O_RDWR, mode=0o600)
        try:
            self._mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        rows = slice(self._first, self._first + self._count)
        for key, array in views(self._mapping, layout).items():
            setattr(self, key, array[rows])
        self._observ_shape = self.observ.shape[1:]
        # The parent holds the reply FIFO's read end, so neither open waits.
        self._command_fd = os.open(command_fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(self._command_fd, True)
        self._reply_fd = os.open(reply_fifo, os.O_WRONLY)

    def _serve(self):
        """Serves the fast channel until the parent closes it (or this process is gone)."""
        read, write = os.read, os.write
        command_fd, reply_fd = self._command_fd, self._reply_fd
        try:
            while True:
                command = read(command_fd, 1)
                if command == STEP:
                    problem = self._step()
                elif command == RESET:
                    size = int.from_bytes(read_exactly(command_fd, 4), "little")
                    problem = self._reset(*pickle.loads(read_exactly(command_fd, size)))
                elif not command:  # End of file: the parent closed the channel.
                    return None
                else:
                    raise ValueError(f"unknown fast channel command {command!r}")
                if problem is None:
                    write(reply_fd, DONE)
                else:
                    write_all(reply_fd, PROBLEM + framed(pickle.dumps(problem)))
        finally:
            # The parent reads end of file: the serving loop ended (its reply says why).
            os.close(reply_fd)
            self._reply_fd = -1

    def _step(self):
        actions = self.action.copy()  # Environments may keep their action.
        observ, reward = self.observ, self.reward
        terminated, truncated = self.terminated, self.truncated
        shape = self._observ_shape
        problem = None
        for j, env in enumerate(self._envs):
            try:
                value, reward[j], terminated[j], truncated[j], _ = env.step(actions[j])
                if getattr(value, "shape", None) != shape and np.shape(value) != shape:
                    if problem is None:
                        problem = (BAD_SHAPE, self._first + j, self._pid, np.shape(value),
                                   repr(value))
                    continue
                observ[j] = value
            except Exception:
                if problem is None or problem[0] != RAISED:
                    problem = (RAISED, self._first + j, self._pid, "step()",
                               traceback.format_exc())
        return problem

    def _reset(self, local_indices, seed):
        observ, shape, first = self.observ, self._observ_shape, self._first
        problem = None
        for j in local_indices:
            try:
                value, _ = self._envs[j].reset(seed=None if seed is None else seed + first + j)
                if getattr(value, "shape", None) != shape and np.shape(value) != shape:
                    if problem is None:
                        problem = (BAD_SHAPE, first + j, self._pid, np.shape(value),
                                   repr(value))
                    continue
                observ[j] = value
            except Exception:
                if problem is None or problem[0] != RAISED:
                    problem = (RAISED, first + j, self._pid, "reset()", traceback.format_exc())
        return problem


def build_group(constructor, count, envs):
    """Builds a group's environments and describes them; shared by the hosts of groups.

    Appends the environments `constructor()` returns to the list `envs` as they are made (so
    that the caller can close those made before a failure).

    Returns:
      `(described, None)`, `described` a list of `(observation_space, action_space, env_id)`
      per environment (the id of its Gymnasium spec, else its class name); or `(None,
      (j, what, traceback_text))` when environment `j` of the group (0-based) raised in
      `what`: "the constructor" or "reading the spaces".
    """
    for j in range(count):
        try:
            envs.append(constructor())
        except Exception:
            return None, (j, "the constructor", traceback.format_exc())
    described = []
    for j, env in enumerate(envs):
        try:
            spec = getattr(env, "spec", None)
            env_id = getattr(spec, "id", None) or type(env.unwrapped).__name__
            described.append((env.observation_space, env.action_space, env_id))
        except Exception:
            return None, (j, "reading the spaces", traceback.format_exc())
    return described, None


def layout(num_envs, observ_shape, action_shape, action_dtype):
    """`{array name: (dtype str, shape, byte offset)}` of the shared arrays of a batch of
    `num_envs`, each aligned to `ALIGN` bytes."""
    arrays_at, offset = {}, 0
    arrays = {
        "action": (action_dtype, (num_envs, *action_shape)),
        "observ": (np.dtype(np.float32), (num_envs, *observ_shape)),
        "reward": (np.dtype(np.float32), (num_envs,)),
        "terminated": (np.dtype(bool), (num_envs,)),
        "truncated": (np.dtype(bool), (num_envs,)),
    }
    for key, (dtype, shape) in arrays.items():
        arrays_at[key] = (dtype.str, shape, offset)
        offset += -(-nbytes(dtype.str, shape) // ALIGN) * ALIGN
    return arrays_at


def nbytes(dtype, shape):
    """The size in bytes of an array of `dtype` and `shape`."""
    return np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))


def views(buffer, layout):
    """NumPy arrays on `buffer` (a memoryview or mmap), one per entry of `layout`."""
    return {
        key: np.ndarray(shape, np.dtype(dtype), buffer, offset)
        for key, (dtype, shape, offset) in layout.items()
    }


def framed(data):
    """`data` preceded by its length (4 bytes, little-endian)."""
    return len(data).to_bytes(4, "little") + data


def write_all(fd, data):
    """Writes all of `data` to the file descriptor `fd` (a pipe may take it in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exactly(fd, size):
    """Reads `size` bytes; raises EOFError at end of file."""
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)

"""A batch of environments hosted by a few worker processes, results in shared memory.

This module must stay free of TensorFlow: worker processes import it.

Protocol
--------
`ParallelBatchEnv` splits its `B` environments into `W` contiguous groups of nearly equal
size and starts one `ExternalProcess` worker per group, hosting an `EnvGroup` of
`batchrl.environments.process_group`; that module describes the two channels between the parent and
each worker and the shared memory they step through.

Why this design (the measurements are in docs/throughput.md, "Why the code is as it is"):
commands and replies are single bytes on FIFOs, not `ExternalProcess`'s pickled messages,
whose pickling costs CPU on both sides of every worker and was a large part of a batch
step's time when the environments themselves cost nothing. Nobody busy-waits: workers
block in `read` between commands, the parent in `poll`. A worker spinning for its next
command helped only while the parent did nothing between steps, not once the parent
computed a policy, and burned CPU that the parent needs on 2 cores; the parent spinning
for the last worker's reply gained nothing measurable.
"""

import contextlib
import functools
import os
import pickle
import secrets
import select
import shutil
import signal
import tempfile
import time
import weakref
from multiprocessing import shared_memory

import numpy as np

from batchrl.environments import process_group as env_group
from batchrl.environments.worker import WorkerBatchEnv
from batchrl.environments.wrappers import ExternalProcess, WorkerError

__all__ = ["ParallelBatchEnv"]

# How often a waiting parent checks that a worker is still alive, in milliseconds.
_POLL_SLICE_MS = 500


class ParallelBatchEnv(WorkerBatchEnv):
    """`B` environments stepped together by `W` worker processes, each hosting several.

    Same interface and semantics as `BatchEnv` (`BaseBatchEnv`'s `step` and `reset` with
    their checks, `len`, `observation_space`, `action_space`, `close`, context manager,
    `blocking` False), except:

    - infos are not transported: `step` and `reset` return tuples of empty dicts;
    - observations, rewards, flags and actions go through shared memory, and the workers are
      told what to do with single bytes on pipes (see the module docstring): a batch step
      costs one tiny message exchange per worker instead of a pickled round trip per
      environment;
    - actions are converted to the action space's dtype in shared memory; each environment
      receives its row (a NumPy array, or a NumPy integer for `Discrete`), a private copy;
    - a failure coming from the environments or the workers (an exception in an environment,
      a dead or hung worker, a non-finite or misshapen result, an interrupt while waiting
      for the workers) closes the whole batch before it is raised: every worker is ended and
      the shared memory unlinked; later calls raise `WorkerError`. Mistakes of the caller
      (actions of the wrong shape, dtype or value, bad indices) do not. `step` and `reset`
      raise `WorkerError` when an environment raised (the message names its batch index
      and contains the worker's traceback), a worker died or did not answer within
      `timeout`, or the batch is closed; ValueError for an observation of the wrong shape.

    Environment `i` (a batch index) lives in worker `k` when it belongs to `k`'s contiguous
    group (`groups`); groups differ in size by at most one. Workers are `ExternalProcess`es:
    started with `forkserver`, without TensorFlow, daemonic, and ended when this object is
    closed or garbage collected or the interpreter exits; they also exit when this process
    dies.

    Not thread-safe: use each instance from one thread at a time.

    Args:
      constructor: zero-argument callable returning a `gymnasium.Env`, called once per
        environment in its worker (e.g. `functools.partial(environments.create,
        "HalfCheetah-v5", 1000)`); pickled with `cloudpickle`. Environments differ only by
        their seeds (`reset(seed=...)`). The observation space must have a fixed shape (a
        `Box`, typically); the action space a shape and a numeric dtype (`Box`, `Discrete`).
      num_envs: the batch size `B`, a positive int.
      num_workers: the number of worker processes, a positive int; None for
        `os.cpu_count()`. At most `num_envs` are started.
      timeout: seconds to wait for any answer of a worker (building its group of
        environments, one step or reset of its group) before it counts as hung and is
        killed.
      name: the environments' name in error messages, e.g. "HalfCheetah-v5" (messages then
        say "env 5 (HalfCheetah-v5)"). By default the environments' `spec.id` (else their
        class name) once built, and a short description of the constructor before.

    Raises:
      ValueError: `num_envs`, `num_workers` or `timeout` is invalid; an environment's
        observation or action space differs from env 0's (the message names the index and
        both spaces); or a space is not supported.
      WorkerError: an environment's constructor raised (the message names its index and
        contains the worker's traceback), or a worker died or did not answer in time.
      pickle.PicklingError, TypeError: the constructor cannot be pickled.
    """

    def __init__(self, constructor, num_envs, num_workers=None, timeout=60.0, name=None):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer):
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if num_workers is None:
            num_workers = os.cpu_count() or 1
        if isinstance(num_workers, bool) or not isinstance(num_workers, int | np.integer):
            raise ValueError(f"num_workers must be a positive int or None, got {num_workers!r}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be a positive int or None, got {num_workers!r}")
        if not float(timeout) > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        num_envs, num_workers = int(num_envs), min(int(num_workers), int(num_envs))
        self._num_envs = num_envs
        self._timeout = float(timeout)
        self._name = name
        self._label = name if name is not None else _describe(constructor)
        self._labels = [self._label] * num_envs
        # Contiguous groups: `(first batch index, count)` per worker.
        base, extra = divmod(num_envs, num_workers)
        counts = [base + (k < extra) for k in range(num_workers)]
        firsts = np.cumsum([0] + counts[:-1]).tolist()
        self._groups = list(zip(firsts, counts, strict=True))
        self._owner = np.repeat(np.arange(num_workers), counts)  # Worker of each env.
        # Names of the workers in error messages, e.g. "envs 16-31 (HalfCheetah-v5)".
        self._worker_names = [
            (f"env {first}" if count == 1 else f"envs {first}-{first + count - 1}")
            + f" ({self._label})"
            for first, count in self._groups
        ]
        self._workers = []
        self._pids = []
        self._channels = _Channels()
        self._memory = _SharedArrays()
        self._closed = None  # Why the batch is closed, once it is.
        self._finalizer = weakref.finalize(
            self, _release, self._workers, self._channels, self._memory)
        try:
            self._start(constructor)
        except BaseException:
            self._close("the batch failed to start")
            raise

    # Public interface.

    @property
    def worker_pids(self):
        """The process ids of the workers (tuple of int), in the order of their groups."""
        return tuple(self._pids)

    def _step(self, actions):
        """Steps all environments through shared memory; returns new arrays (the caller may
        keep them) and a tuple of `B` empty dicts."""
        if self._closed is not None:
            raise WorkerError(f"{self!r}: {self._closed}")
        np.copyto(self._action, actions, casting="same_kind")
        self._exchange(self._all_workers, env_group.STEP)
        memory = self._memory
        return (memory.observ.copy(), memory.reward.copy(), memory.terminated.copy(),
                memory.truncated.copy(), tuple([{} for _ in range(self._num_envs)]))

    def _reset(self, indices, seed):
        """Resets the environments at `indices` in their workers; returns a new array in the
        order of `indices` and a tuple of empty dicts."""
        if self._closed is not None:
            raise WorkerError(f"{self!r}: {self._closed}")
        owners = self._owner[indices]
        workers, messages = [], {}
        for worker in np.unique(owners).tolist():
            first = self._groups[worker][0]
            local = sorted((indices[owners == worker] - first).tolist())
            workers.append(worker)
            messages[worker] = env_group.RESET + env_group.framed(pickle.dumps((local, seed)))
        self._exchange(workers, messages)
        observ = self._memory.observ[indices]  # A copy, in the order of `indices`.
        return observ, tuple([{} for _ in range(len(indices))])

    # Start-up.

    def _start(self, constructor):
        """Starts the workers, builds the environments, checks the spaces, maps the memory,
        opens the fast channels."""
        for (first, count), name in zip(self._groups, self._worker_names, strict=True):
            self._workers.append(ExternalProcess(
                functools.partial(env_group.EnvGroup, constructor, first, count),
                name=name, timeout=self._timeout))
        # At exit, weakref finalizers run newest first: ours must close the fast channels
        # (workers then leave their serving loop) before the workers' own finalizers ask
        # them to exit, or each of those would wait for its worker in vain.
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _release, self._workers, self._channels, self._memory)
        replies = self._set_up((env_group.BUILD,) for _ in self._groups)
        self._pids = [reply["pid"] for reply in replies]
        described = [entry for reply in replies for entry in reply["envs"]]
        if self._name is None:
            self._labels = [env_id for _, _, env_id in described]
        self._init_contract(self._num_envs, *described[0][:2])
        self._check_spaces(described)
        layout = env_group.layout(self._num_envs, self._observ_shape,
                                  self._action_batch_shape[1:], self._action_dtype)
        memory = self._memory
        memory.create(layout)
        self._action = memory.action
        fifos = self._channels.make_fifos(len(self._groups))
        self._set_up((env_group.ATTACH, memory.segment_name, memory.size, layout, *fifos[k])
                     for k in range(len(self._groups)))
        self._channels.open_command_ends()
        self._serving = [worker.step((env_group.SERVE,), blocking=False)
                         for worker in self._workers]
        self._all_workers = list(range(len(self._groups)))

    def _set_up(self, commands):
        """Sends one set-up command per worker through ExternalProcess, returns the replies.

        Raises the first failure (after all replies were read), or an environment's problem.
        """
        promises = [worker.step(command, blocking=False)
                    for worker, command in zip(self._workers, commands, strict=True)]
        replies, failure = [], None
        for promise in promises:
            try:
                replies.append(promise())
            except WorkerError as error:
                failure = failure or error
        if failure is not None:
            raise failure
        problems = [reply for reply in replies if type(reply) is tuple]
        if problems:
            raise self._problem_error(problems)
        return replies

    # Stepping.

    def _exchange(self, workers, message):
        """Sends `message` (bytes, or a dict of bytes per worker) to `workers` on the fast
        channel and waits for all their replies. Closes the batch on any failure, then
        raises the first worker failure, else the problem of the lowest batch index."""
        channels = self._channels
        try:
            write = os.write
            commands = channels.commands
            if type(message) is bytes:
                for k in workers:
                    try:
                        write(commands[k], message)
                    except OSError:  # The worker closed its end: it stopped or died.
                        self._worker_gone(k)
            else:
                for k in workers:
                    try:
                        env_group.write_all(commands[k], message[k])
                    except OSError:
                        self._worker_gone(k)
            problems, failure = None, None
            for k in workers:
                try:
                    problem = self._wait(k)
                except WorkerError as error:
                    failure = failure or error
                    continue
                if problem is not None:
                    problems = (problems or []) + [problem]
        except BaseException as error:  # E.g. KeyboardInterrupt: the workers are mid-step.
            self._fail(error)
        if failure is not None:
            self._fail(failure)
        if problems:
            self._fail(self._problem_error(problems))

    def _wait(self, k):
        """Waits for worker `k`'s reply; returns None or its problem tuple.

        Raises:
          WorkerError: the worker died or stopped serving, or did not answer in time.
        """
        fd = self._channels.replies[k]
        poll = self._channels.pollers[k].poll
        deadline = time.monotonic() + self._timeout
        while True:
            if poll(_POLL_SLICE_MS):
                reply = os.read(fd, 1)
                if reply == env_group.DONE:
                    return None
                if reply == env_group.PROBLEM:
                    try:
                        size = int.from_bytes(env_group.read_exactly(fd, 4), "little")
                        return pickle.loads(env_group.read_exactly(fd, size))
                    except EOFError:
                        pass
                self._worker_gone(k)
            now = time.monotonic()
            if not _exists(self._pids[k]):
                self._worker_gone(k)
            if now >= deadline:
                pid = self._pids[k]
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                raise WorkerError(
                    f"{self._worker_names[k]}: the worker process (pid {pid}) did not answer "
                    f"within {self._timeout:g} s and was killed")

    def _worker_gone(self, k):
        """Raises the `WorkerError` of worker `k`, whose fast channel broke: ExternalProcess
        reports its death (exit code or signal) or the traceback of its serving loop."""
        self._channels.close_worker(k)  # Makes a worker that is still serving stop.
        self._serving[k]()
        raise WorkerError(f"{self._worker_names[k]}: the worker process (pid "
                          f"{self._pids[k]}) stopped serving")

    def _problem_error(self, problems):
        """The exception for the most important problem: an environment's exception first
        (as BatchEnv), then the lowest batch index."""
        kind, index, pid, *details = min(
            problems, key=lambda problem: (problem[0] != env_group.RAISED, problem[1]))
        if kind == env_group.RAISED:
            what, worker_traceback = details
            return WorkerError(
                f"env {index} ({self._labels[index]}): {what} raised in the worker process "
                f"(pid {pid}):\n{worker_traceback}")
        shape, value = details
        return ValueError(
            f"env {index} returned an observation of shape {shape}, expected "
            f"{self._observ_shape}: {value}")


def _release(workers, channels, memory):
    """Ends the workers, then unlinks the shared memory. Safe to call repeatedly."""
    try:
        channels.close()  # Every worker leaves its serving loop.
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.close()
    finally:
        memory.release()


class _Channels:
    """The parent's ends of the fast channels: file descriptors per worker."""

    def __init__(self):
        self.commands = []  # Write ends, parent -> worker.
        self.replies = []  # Read ends, worker -> parent.
        self.pollers = []
        self._directory = None
        self._fifos = []

    def make_fifos(self, count):
        """Creates `count` pairs of FIFOs in a private directory and opens the reply ends.

        Returns:
          list of `(command_fifo, reply_fifo)` paths, for the workers to open.
        """
        self._directory = tempfile.mkdtemp(prefix=f"batchrl-fifos-{os.getpid()}-")
        for k in range(count):
            command = os.path.join(self._directory, f"command-{k}")
            reply = os.path.join(self._directory, f"reply-{k}")
            os.mkfifo(command, 0o600)
            os.mkfifo(reply, 0o600)
            self._fifos.append((command, reply))
            fd = os.open(reply, os.O_RDONLY | os.O_NONBLOCK)  # Does not wait for a writer.
            os.set_blocking(fd, True)
            self.replies.append(fd)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self.pollers.append(poller)
        return self._fifos

    def open_command_ends(self):
        """Opens the command ends (the workers have opened theirs), removes the FIFOs."""
        try:
            for command, _ in self._fifos:
                self.commands.append(os.open(command, os.O_WRONLY | os.O_NONBLOCK))
                os.set_blocking(self.commands[-1], True)
        finally:
            self._remove_fifos()

    def close_worker(self, k):
        """Closes worker `k`'s channel (it stops serving); its descriptors become -1."""
        for fds in (self.commands, self.replies):
            if k < len(fds) and fds[k] >= 0:
                with contextlib.suppress(OSError):
                    os.close(fds[k])
                fds[k] = -1

    def close(self):
        for k in range(max(len(self.commands), len(self.replies))):
            self.close_worker(k)
        self._remove_fifos()

    def _remove_fifos(self):
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


class _SharedArrays:
    """The parent's shared memory segment and its arrays (see `env_group.layout`)."""

    def __init__(self):
        self._segment = None
        self.segment_name = None
        self.size = 0

    def create(self, layout):
        self.size = max(env_group.ALIGN, max(offset + env_group.nbytes(dtype, shape)
                                    for dtype, shape, offset in layout.values()))
        name = f"batchrl-{os.getpid()}-{secrets.token_hex(6)}"
        self._segment = shared_memory.SharedMemory(name=name, create=True, size=self.size)
        self.segment_name = self._segment.name
        for key, array in env_group.views(self._segment.buf, layout).items():
            setattr(self, key, array)

    def release(self):
        segment, self._segment = self._segment, None
        if segment is None:
            return
        for key in env_group.ARRAYS:
            self.__dict__.pop(key, None)  # Drop the views so that the mapping can be closed.
        with contextlib.suppress(BufferError):
            segment.close()
        with contextlib.suppress(FileNotFoundError):
            segment.unlink()


def _exists(pid):
    """Whether process `pid` exists (a zombie counts; the fork server reaps its children)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(constructor):
    """A short description of a constructor for error messages."""
    if isinstance(constructor, functools.partial):
        arguments = [repr(value) for value in constructor.args]
        arguments += [f"{key}={value!r}" for key, value in constructor.keywords.items()]
        text = f"{_describe(constructor.func)}({', '.join(arguments)})"
    else:
        text = getattr(constructor, "__qualname__", None) or repr(constructor)
    return text if len(text) <= 80 else text[:77] + "..."

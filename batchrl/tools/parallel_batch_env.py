"""A batch of environments hosted by a few worker processes, results in shared memory.

This module must stay free of TensorFlow: worker processes import it.

Protocol
--------
`ParallelBatchEnv` splits its `B` environments into `W` contiguous groups of nearly equal
size and starts one `ExternalProcess` worker per group, hosting an `EnvGroup` of
`batchrl.tools.env_group`; that module describes the two channels between the parent and
each worker and the shared memory they step through.

Why this design (measured on the 2-core machine, `scripts/parallel_step_benchmark.py`):
ExternalProcess's pickled request and reply cost about 20 us of CPU on each side per worker;
with environments that do nothing, a batch step of 32 in 2 workers took 130 us of wall time
(165 us of CPU) that way and 63 us (72 us) with single bytes on FIFOs. Nobody busy-waits:
workers block in `read` between commands, the parent in `poll`. A worker spinning 50 us for
its next command saved 30-40 us per step in a prototype whose parent did nothing between
steps, but nothing once the parent computed for 100 us between steps (as a policy does), while
burning CPU the parent needs on 2 cores; the parent spinning for the last worker's reply
gained nothing measurable with HalfCheetah or Pendulum.
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

from batchrl.tools import env_group
from batchrl.tools.wrappers import ExternalProcess, WorkerError

__all__ = ["ParallelBatchEnv"]

# How often a waiting parent checks that a worker is still alive, in milliseconds.
_POLL_SLICE_MS = 500


class ParallelBatchEnv:
    """`B` environments stepped together by `W` worker processes, each hosting several.

    Same interface and semantics as `BatchEnv` (`step`, `reset`, `len`, `observation_space`,
    `action_space`, `close`, context manager, `blocking` False), except:

    - infos are not transported: `step` and `reset` return tuples of empty dicts;
    - observations, rewards, flags and actions go through shared memory, and the workers are
      told what to do with single bytes on pipes (see the module docstring): a batch step
      costs one tiny message exchange per worker instead of a pickled round trip per
      environment;
    - a failure coming from the environments or the workers (an exception in an environment,
      a dead or hung worker, a non-finite or misshapen result, an interrupt while waiting
      for the workers) closes the whole batch before it is raised: every worker is ended and
      the shared memory unlinked; later calls raise `WorkerError`. Mistakes of the caller
      (actions of the wrong shape or dtype, bad indices) do not;
    - `reset` rejects repeated indices.

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
        self._default_label = name if name is not None else _describe(constructor)
        self._labels = [self._default_label] * num_envs
        # Contiguous groups: `(first batch index, count)` per worker.
        base, extra = divmod(num_envs, num_workers)
        counts = [base + (k < extra) for k in range(num_workers)]
        firsts = np.cumsum([0] + counts[:-1]).tolist()
        self._groups = list(zip(firsts, counts, strict=True))
        self._owner = np.repeat(np.arange(num_workers), counts)  # Worker of each env.
        # Names of the workers in error messages, e.g. "envs 16-31 (HalfCheetah-v5)".
        self._worker_names = [
            (f"env {first}" if count == 1 else f"envs {first}-{first + count - 1}")
            + f" ({self._default_label})"
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

    def __len__(self):
        """The batch size `B`."""
        return self._num_envs

    def __repr__(self):
        return (f"ParallelBatchEnv({self._default_label}, num_envs={self._num_envs}, "
                f"num_workers={len(self._groups)})")

    @property
    def observation_space(self):
        """The observation space shared by all environments (of a single environment)."""
        return self._observation_space

    @property
    def action_space(self):
        """The action space shared by all environments (of a single environment)."""
        return self._action_space

    @property
    def blocking(self):
        """False: the workers step their environments in parallel."""
        return False

    @property
    def num_workers(self):
        """The number of worker processes `W` (int)."""
        return len(self._groups)

    @property
    def worker_pids(self):
        """The process ids of the workers (tuple of int), in the order of their groups."""
        return tuple(self._pids)

    @property
    def groups(self):
        """The batch indices each worker hosts: a tuple of `range`s, one per worker."""
        return tuple(range(first, first + count) for first, count in self._groups)

    def step(self, actions):
        """Steps all environments once.

        Args:
          actions: array-like `[B, *action_shape]`, one action per environment (`[B]`
            integers for a `Discrete` action space). Converted to the action space's dtype
            (e.g. float32) in shared memory; each environment receives its row (a NumPy
            array, or a NumPy integer for `Discrete`), a private copy.

        Returns:
          `(observ, reward, terminated, truncated, infos)`: observ float32
          `[B, *observation_shape]`, reward float32 `[B]`, terminated bool `[B]`, truncated
          bool `[B]` (new arrays, the caller may keep them), infos a tuple of `B` empty
          dicts (infos are not transported).

        Raises:
          ValueError: `actions` does not have shape `[B, *action_shape]` or cannot be
            converted to the action space's dtype (the batch stays usable); or an
            environment returned a NaN or infinite observation or reward, or an
            observation of the wrong shape (the message names the index and the value).
          WorkerError: an environment raised in `step` (the message names its batch index
            and contains the worker's traceback), a worker died or did not answer within
            `timeout`, or the batch is closed.
        """
        if self._closed is not None:
            raise WorkerError(f"{self!r}: {self._closed}")
        actions = np.asarray(actions)
        if actions.shape != self._action_batch_shape:
            raise ValueError(
                f"expected actions of shape {self._action_batch_shape} (batch size "
                f"{self._num_envs}, action shape {self._action_space.shape}), "
                f"got shape {actions.shape}"
            )
        try:
            np.copyto(self._action, actions, casting="same_kind")
        except TypeError:
            raise ValueError(
                f"expected actions convertible to {self._action.dtype} (the action space's "
                f"dtype), got dtype {actions.dtype}"
            ) from None
        self._exchange(self._all_workers, env_group.STEP)
        memory = self._memory
        observ = memory.observ.copy()
        reward = memory.reward.copy()
        if not np.isfinite(observ).all():
            self._fail(ValueError(self._non_finite_observation(observ, range(self._num_envs))))
        if not np.isfinite(reward).all():
            index = int(np.flatnonzero(~np.isfinite(reward))[0])
            self._fail(ValueError(
                f"env {index} returned a non-finite reward: {float(reward[index])!r}"))
        return (observ, reward, memory.terminated.copy(), memory.truncated.copy(),
                tuple([{} for _ in range(self._num_envs)]))

    def reset(self, indices=None, seed=None):
        """Resets the environments at the given batch indices, and only those.

        Args:
          indices: sequence or 1-D integer array of distinct batch indices; all
            environments if None.
          seed: optional int; environment `i` (a batch index) is then reset with seed
            `seed + i`.

        Returns:
          `(observ, infos)`: observ float32 `[len(indices), *observation_shape]` (a new
          array) in the order of `indices`, infos a tuple of `len(indices)` empty dicts.

        Raises:
          IndexError: an index is out of range (negative indices are not allowed).
          ValueError: an index appears twice; or an environment returned a NaN or infinite
            observation, or one of the wrong shape (the message names the index and the
            value).
          WorkerError: an environment raised in `reset` (the message names its batch index
            and contains the worker's traceback), a worker died or did not answer within
            `timeout`, or the batch is closed.
        """
        if self._closed is not None:
            raise WorkerError(f"{self!r}: {self._closed}")
        if indices is None:
            indices = np.arange(self._num_envs)
        else:
            indices = np.asarray(indices, dtype=np.int64).reshape(-1)
            for index in indices.tolist():
                if not 0 <= index < self._num_envs:
                    raise IndexError(
                        f"batch index {index} out of range for a batch of {self._num_envs}")
            values, counts = np.unique(indices, return_counts=True)
            if (counts > 1).any():
                raise ValueError(
                    f"batch index {int(values[counts > 1][0])} appears more than once in "
                    f"the indices to reset: {indices.tolist()}")
        seed = None if seed is None else int(seed)
        if not len(indices):
            return np.zeros((0, *self._observ_shape), np.float32), ()
        owners = self._owner[indices]
        workers, messages = [], {}
        for worker in np.unique(owners).tolist():
            first = self._groups[worker][0]
            local = sorted((indices[owners == worker] - first).tolist())
            workers.append(worker)
            messages[worker] = env_group.RESET + env_group.framed(pickle.dumps((local, seed)))
        self._exchange(workers, messages)
        observ = self._memory.observ[indices]  # A copy, in the order of `indices`.
        if not np.isfinite(observ).all():
            self._fail(ValueError(self._non_finite_observation(observ, indices.tolist())))
        return observ, tuple([{} for _ in range(len(indices))])

    def close(self):
        """Ends every worker (closing its environments) and unlinks the shared memory.

        Idempotent; never raises for workers that already died.
        """
        self._close("the batch is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

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
        self._observation_space, self._action_space, _ = described[0]
        for index, (observation_space, action_space, _) in enumerate(described):
            if observation_space != self._observation_space:
                raise ValueError(
                    f"observation space of env {index} ({observation_space!r}) differs "
                    f"from that of env 0 ({self._observation_space!r})"
                )
            if action_space != self._action_space:
                raise ValueError(
                    f"action space of env {index} ({action_space!r}) differs "
                    f"from that of env 0 ({self._action_space!r})"
                )
        self._observ_shape = _fixed_shape(self._observation_space, "observation")
        action_shape = _fixed_shape(self._action_space, "action")
        action_dtype = np.dtype(getattr(self._action_space, "dtype", None) or np.float32)
        if action_dtype.kind not in "biuf":
            raise ValueError(f"unsupported action space {self._action_space!r}: "
                             "its dtype is not numeric")
        self._action_batch_shape = (self._num_envs, *action_shape)
        layout = env_group.layout(self._num_envs, self._observ_shape, action_shape, action_dtype)
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

    def _non_finite_observation(self, observ, indices):
        bad = ~np.isfinite(observ.reshape(len(observ), -1)).all(axis=1)
        position = int(np.flatnonzero(bad)[0])
        return (f"env {list(indices)[position]} returned a non-finite observation: "
                f"{observ[position]!r}")

    def _fail(self, error):
        """Closes the batch after a failure, then raises `error`."""
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        self._close(f"the batch was closed after an error: {first_line}")
        raise error

    def _close(self, why):
        if self._closed is None:
            self._closed = why
        self._finalizer()


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


def _fixed_shape(space, what):
    shape = getattr(space, "shape", None)
    if not isinstance(shape, tuple) or not all(isinstance(n, int) for n in shape):
        raise ValueError(f"unsupported {what} space {space!r}: it has no fixed shape")
    return shape


def _describe(constructor):
    """A short description of a constructor for error messages."""
    if isinstance(constructor, functools.partial):
        arguments = [repr(value) for value in constructor.args]
        arguments += [f"{key}={value!r}" for key, value in constructor.keywords.items()]
        text = f"{_describe(constructor.func)}({', '.join(arguments)})"
    else:
        text = getattr(constructor, "__qualname__", None) or repr(constructor)
    return text if len(text) <= 80 else text[:77] + "..."

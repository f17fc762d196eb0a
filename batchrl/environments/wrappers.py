"""Per-environment wrappers: an environment in a separate process, and standard wrappers.

This module must stay free of TensorFlow: it is imported by the worker processes.

Worker protocol: one duplex `multiprocessing.Pipe` per worker; every message is one tuple
pickled with the plain `pickle` module (highest protocol; cheaper than the `ForkingPickler`
of `Connection.send`) and sent with `send_bytes`:

  parent -> worker: `(message, payload)` with message one of
    `_STEP`    payload `action`                   -> `env.step(action)`
    `_RESET`   payload `(seed, options)`          -> `env.reset(seed=seed, options=options)`
    `_CALL`    payload `(name, args, kwargs)`     -> `getattr(env, name)(*args, **kwargs)`
    `_GETATTR` payload `name`                     -> `getattr(env, name)`
    `_CLOSE`   payload `None`                     -> `env.close()`, then the worker exits
  worker -> parent: `(kind, value)`, exactly one reply per request, in request order, plus
  one first reply for the constructor (`value` None once the environment is built), with
  kind one of
    `_RESULT`          value is the result
    `_EXCEPTION`       value is the worker's formatted traceback
    `_ATTRIBUTE_ERROR` value is the formatted traceback of an `AttributeError` in `_GETATTR`
    `_METHOD`          value is None: the attribute read by `_GETATTR` is callable (a method),
                       the parent returns a function that forwards calls with `_CALL`
"""

import contextlib
import functools
import multiprocessing
import operator
import pickle
import select
import signal
import sys
import threading
import time
import traceback
import types
import warnings
import weakref

import cloudpickle
import gymnasium
import numpy as np
from gymnasium import spaces

from batchrl.spaces import nested

__all__ = ["ExternalProcess", "WorkerError", "standard_wrappers"]

# Messages from the parent to the worker.
_STEP = 0
_RESET = 1
_CALL = 2
_GETATTR = 3
_CLOSE = 4

# Replies from the worker to the parent.
_RESULT = 0
_EXCEPTION = 1
_ATTRIBUTE_ERROR = 2
_METHOD = 3

_dumps = functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)

# What `_result` returns for a `_METHOD` reply.
_METHOD_MARKER = object()

# Attributes that cannot change during the life of an environment; read once, then cached.
_CACHED_ATTRIBUTES = frozenset({"observation_space", "action_space", "spec", "render_mode"})

# How often a waiting parent checks that its worker is still alive, in milliseconds.
_POLL_SLICE_MS = 500

# How long `close()` waits for a worker to close its environment and exit, in seconds.
_CLOSE_TIMEOUT = 5.0

_START_METHOD = "forkserver"
_START_LOCK = threading.Lock()
_forkserver_preloaded = False


class WorkerError(RuntimeError):
    """Something went wrong in the worker process of an `ExternalProcess`.

    The message names the environment and says what happened: an exception in the worker
    (the message then contains the worker's formatted traceback), a worker that died (with its
    exit code), or a worker that did not answer in time (it is then killed).
    """


class ExternalProcess:
    """A Gymnasium environment that lives in a separate worker process.

    The worker is started with the `forkserver` start method (never `fork`: the parent may
    have TensorFlow loaded) and does not import TensorFlow, nor the parent's `__main__`
    module: the constructor is sent pickled with `cloudpickle`, which pickles functions and
    classes defined in `__main__` (and lambdas) by value. The fork server preloads this
    module (Gymnasium, NumPy), so a worker starts in milliseconds plus the constructor's
    time (docs/throughput.md, "Why the code is as it is").

    `step`, `reset`, `call` and attribute reads are forwarded to the environment. Any
    exception in the worker is raised here as `WorkerError` with the worker's traceback; the
    worker keeps serving afterwards. A worker that dies is reported as `WorkerError` within
    about half a second, and one that does not answer within `timeout` seconds is
    killed and reported as `WorkerError`; the object is unusable after either (except for
    `close()`). Workers are daemonic and closed when this object is garbage collected or the
    interpreter exits, so that no worker outlives its parent.

    Not thread-safe: use each instance from one thread at a time.

    Args:
      constructor: zero-argument callable returning a `gymnasium.Env`; pickled with
        `cloudpickle` and called in the worker.
      name: the environment's name in error messages, e.g. "env 3 (Pendulum-v1)"; by default
        the constructor's repr.
      timeout: seconds to wait for any answer of the worker (including the construction of
        the environment) before it is considered hung.

    Raises:
      WorkerError: the constructor raised in the worker, the worker died, or the environment
        was not built within `timeout` seconds.
      pickle.PicklingError, TypeError: the constructor cannot be pickled.
    """

    def __init__(self, constructor, name=None, timeout=60.0):
        self._name = name if name is not None else repr(constructor)
        self._timeout = float(timeout)
        self._cache = {}
        self._broken = None  # Message of a fatal error (dead, hung or closed worker).
        payload = cloudpickle.dumps(constructor)
        context = multiprocessing.get_context(_START_METHOD)
        self._conn, worker_conn = context.Pipe()
        self._process = context.Process(
            target=_worker,
            args=(worker_conn, payload),
            name=f"batchrl-worker {self._name}",
            daemon=True,
        )
        with starting_workers(context):
            self._process.start()
        # Only the worker may hold its end: when it dies, the parent then reads end-of-file.
        worker_conn.close()
        # A `select.poll` object made once is much cheaper than `Connection.poll`, which
        # builds a new selector on every call (docs/throughput.md).
        self._poller = select.poll()
        self._poller.register(self._conn.fileno(), select.POLLIN)
        self._finalizer = weakref.finalize(self, _shutdown, self._process, self._conn)
        # The first reply (number 0) is the constructor's; requests are numbered from 1.
        self._sent = 1
        self._received = 0
        self._replies = {}
        self._labels = {0: "the constructor"}
        try:
            self._result(0)
        except BaseException:
            self.close()
            raise

    @property
    def name(self):
        """The environment's name used in error messages (str)."""
        return self._name

    def __repr__(self):
        return f"ExternalProcess({self._name}, pid={self._process.pid})"

    def __getattr__(self, name):
        """Reads an attribute of the environment in the worker.

        `observation_space`, `action_space`, `spec` and `render_mode` are read once and cached.
        A method (any callable attribute but a class) is returned as a function that calls it
        in the worker (like `call`); other values are returned pickled, as copies.

        Raises:
          AttributeError: the environment has no such attribute (or the name is private).
          WorkerError: reading the attribute raised another exception, or the worker failed.
        """
        if name.startswith("_"):
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r} "
                "(private attributes are not forwarded to the worker)"
            )
        cache = self._cache
        if name in cache:
            return cache[name]
        value = self._result(self._request(_GETATTR, name, f"reading attribute {name!r}"))
        if value is _METHOD_MARKER:
            return functools.partial(self.call, name)
        if name in _CACHED_ATTRIBUTES:
            cache[name] = value
        return value

    def step(self, action, blocking=True):
        """Steps the environment: `env.step(action)`.

        Args:
          action: an element of the environment's action space (must be picklable).
          blocking: if False, return a promise at once instead of waiting for the result.

        Returns:
          `(observation, reward, terminated, truncated, info)` as returned by the environment,
          or with `blocking=False` a zero-argument callable returning it.

        Raises:
          WorkerError: `env.step` raised in the worker (the message contains its traceback),
            the worker died, or it did not answer within `timeout` seconds. Raised by the
            promise with `blocking=False`.
        """
        seq = self._request(_STEP, action, "step()")
        if blocking:
            return self._result(seq)
        return _Promise(self, seq)

    def reset(self, seed=None, options=None, blocking=True):
        """Resets the environment: `env.reset(seed=seed, options=options)`.

        Args:
          seed: optional int seed of the environment's random number generator.
          options: optional dict of options passed to the environment.
          blocking: if False, return a promise at once instead of waiting for the result.

        Returns:
          `(observation, info)`, or with `blocking=False` a zero-argument callable returning it.

        Raises:
          WorkerError: as for `step`.
        """
        seq = self._request(_RESET, (seed, options), "reset()")
        if blocking:
            return self._result(seq)
        return _Promise(self, seq)

    def call(self, name, *args, **kwargs):
        """Calls a method of the environment: `getattr(env, name)(*args, **kwargs)`.

        Returns:
          The method's result (which must be picklable).

        Raises:
          WorkerError: the call raised in the worker (the message contains its traceback),
            the worker died, or it did not answer within `timeout` seconds.
        """
        seq = self._request(_CALL, (name, args, kwargs), f"call of {name}()")
        return self._result(seq)

    def close(self):
        """Closes the environment and ends the worker process.

        Asks the worker to close its environment and exit, waits up to `_CLOSE_TIMEOUT`
        seconds, then terminates and finally kills it. Idempotent; never raises for a worker
        that already died.
        """
        if self._broken is None:
            self._broken = f"{self._name}: the environment is closed"
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # Implementation.

    def _request(self, message, payload, label):
        """Sends one request to the worker and returns its sequence number."""
        if self._broken is not None:
            raise WorkerError(self._broken)
        try:
            data = _dumps((message, payload))
        except Exception as error:
            raise TypeError(f"{self._name}: cannot pickle the {label} request: {error}") from error
        try:
            self._conn.send_bytes(data)
        except OSError:
            self._fail_dead()
        seq = self._sent
        self._sent = seq + 1
        self._labels[seq] = label
        return seq

    def _result(self, seq):
        """Returns the result of request `seq`, reading earlier replies first if needed."""
        while self._received <= seq:
            self._replies[self._received] = self._receive()
            self._received += 1
        kind, value = self._replies.pop(seq)
        label = self._labels.pop(seq)
        if kind == _RESULT:
            return value
        if kind == _METHOD:
            return _METHOD_MARKER
        if kind == _ATTRIBUTE_ERROR:
            raise AttributeError(f"{self._name}: {label} failed in the worker process:\n{value}")
        raise WorkerError(f"{self._name}: {label} raised in the worker process:\n{value}")

    def _receive(self):
        """Reads the next reply, watching for a dead or hung worker."""
        conn = self._conn
        if self._broken is not None:
            raise WorkerError(self._broken)
        poll = self._poller.poll
        deadline = time.monotonic() + self._timeout
        while True:
            # Readable means a reply or end-of-file (the worker died).
            if poll(_POLL_SLICE_MS):
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    self._fail_dead()
                try:
                    return pickle.loads(data)
                except Exception:
                    return (
                        _EXCEPTION,
                        "the reply cannot be unpickled in the parent process:\n"
                        + traceback.format_exc(),
                    )
            if not self._process.is_alive():
                self._fail_dead()
            if time.monotonic() >= deadline:
                self._fail_hung()

    def _fail_dead(self):
        process = self._process
        process.join(1.0)
        code = process.exitcode
        if code is None:
            how = "closed its connection but is still running"
        elif code < 0:
            try:
                how = f"died from signal {signal.Signals(-code).name} (exit code {code})"
            except ValueError:
                how = f"died with exit code {code}"
        else:
            how = f"died with exit code {code}"
        self._broken = f"{self._name}: the worker process (pid {process.pid}) {how}"
        self._finalizer()
        raise WorkerError(self._broken)

    def _fail_hung(self):
        process = self._process
        self._broken = (
            f"{self._name}: the worker process (pid {process.pid}) did not answer within "
            f"{self._timeout:g} s and was killed"
        )
        with contextlib.suppress(OSError, ValueError):
            process.kill()
        self._finalizer()
        raise WorkerError(self._broken)


class _Promise:
    """The result of a non-blocking request: call it (without arguments) to get the result.

    The first call waits for the result; later calls return it (or raise the same error) again.
    """

    __slots__ = ("_env", "_seq", "_done", "_value", "_error")

    def __init__(self, env, seq):
        self._env = env
        self._seq = seq
        self._done = False
        self._value = None
        self._error = None

    def __call__(self):
        if not self._done:
            try:
                self._value = self._env._result(self._seq)
            except BaseException as error:
                self._error = error
                raise
            finally:
                self._done = True
                self._env = None
        if self._error is not None:
            raise self._error
        return self._value


@contextlib.contextmanager
def starting_workers(context):
    """Context in which to start forkserver worker processes the way batchrl's are started.

    - Holds a lock, so that concurrent starts do not interleave.
    - Makes the fork server, if it is not running yet, import this module (Gymnasium,
      NumPy) once before it forks: workers then start in milliseconds instead of importing
      Gymnasium each, which takes far longer (docs/throughput.md, "Why the code is as it
      is"). This replaces the fork server's default preload of `__main__`, which workers
      do not need.
    - Hides the parent's `__main__` module: spawn and forkserver children normally
      re-import it (a training script that imports TensorFlow, or `<stdin>`, which fails).
      Workers need nothing from it: constructors that live in `__main__` are pickled by
      value by cloudpickle.

    Args:
      context: a `multiprocessing` context.
    """
    global _forkserver_preloaded
    with _START_LOCK:
        if not _forkserver_preloaded and context.get_start_method() == "forkserver":
            context.set_forkserver_preload([__name__])
            _forkserver_preloaded = True
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is None:
                del sys.modules["__main__"]
            else:
                sys.modules["__main__"] = main


def _shutdown(process, conn):
    """Closes a worker: ask it to exit, then terminate, then kill. Safe to call repeatedly."""
    try:
        if process.exitcode is None:
            with contextlib.suppress(OSError, EOFError, ValueError):
                conn.send_bytes(_dumps((_CLOSE, None)))
            process.join(_CLOSE_TIMEOUT)
            if process.exitcode is None:
                process.terminate()
                process.join(1.0)
            if process.exitcode is None:
                process.kill()
                process.join(1.0)
    finally:
        conn.close()


def _worker(conn, payload):
    """Worker process: builds the environment and serves requests until `_CLOSE` or EOF."""
    # Interrupts (Ctrl-C) are the parent's to handle; it then closes the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dumps, loads = _dumps, pickle.loads
    recv_bytes, send_bytes = conn.recv_bytes, conn.send_bytes
    try:
        env = cloudpickle.loads(payload)()
    except Exception:
        send_bytes(dumps((_EXCEPTION, traceback.format_exc())))
        conn.close()
        return
    send_bytes(dumps((_RESULT, None)))
    try:
        while True:
            try:
                data = recv_bytes()
            except (EOFError, OSError):  # The parent is gone.
                break
            try:
                message, payload = loads(data)
                if message == _STEP:
                    reply = (_RESULT, env.step(payload))
                elif message == _RESET:
                    reply = (_RESULT, env.reset(seed=payload[0], options=payload[1]))
                elif message == _CALL:
                    name, args, kwargs = payload
                    reply = (_RESULT, getattr(env, name)(*args, **kwargs))
                elif message == _GETATTR:
                    try:
                        value = getattr(env, payload)
                    except AttributeError:
                        reply = (_ATTRIBUTE_ERROR, traceback.format_exc())
                    else:
                        is_method = callable(value) and not isinstance(value, type)
                        reply = (_METHOD, None) if is_method else (_RESULT, value)
                elif message == _CLOSE:
                    break
                else:
                    raise ValueError(f"unknown message {message!r} in the worker protocol")
            except Exception:
                reply = (_EXCEPTION, traceback.format_exc())
            try:
                data = dumps(reply)
            except Exception:  # The result cannot be pickled.
                data = dumps((_EXCEPTION, traceback.format_exc()))
            try:
                send_bytes(data)
            except OSError:  # The parent is gone.
                break
    finally:
        with contextlib.suppress(Exception):
            env.close()
        conn.close()


def standard_wrappers(env, max_episode_steps=None):
    """Applies the per-environment wrappers that training needs (Gymnasium's own wrappers).

    - `max_episode_steps` given: a `gymnasium.wrappers.TimeLimit` of that many steps, unless
      the environment already has a time limit of exactly that length. An existing outermost
      `TimeLimit` of another length is replaced; a deeper one is kept when the new limit is
      shorter (the outer limit then ends episodes first).
    - `Box` action space with finite bounds: `ClipAction(RescaleAction(env, -1, 1))`, so the
      agent acts in [-1, 1] (actions outside are clipped) and -1 / 1 map to the original
      bounds. The returned environment declares `Box(-1, 1, shape, dtype)` as its action space
      (Gymnasium's `ClipAction` alone would declare infinite bounds). A `Box` with any
      infinite bound is left as it is.
    - `Discrete(n, start)` action space with `start` other than 0: Gymnasium's
      `TransformAction` declaring `Discrete(n)`, so the agent acts with indices 0 ... n - 1,
      as for a `Discrete` leaf of a nested space, and the environment receives
      `start + index`. A `Discrete` starting at 0 is left untouched.
    - `MultiDiscrete`, `MultiBinary`, or `Dict` / `Tuple` action space (nested; leaves `Box`,
      `Discrete`, `MultiDiscrete`, `MultiBinary`): `batchrl.spaces.nested.UnflattenAction`, so
      the agent acts with one flat float32 vector (`FlatActionSpace`: a `Box` leaf in [-1, 1]
      as above, an index per `Discrete` choice, a bit per `MultiBinary` element).
    - `Discrete`, `MultiDiscrete`, `MultiBinary`, or `Dict` / `Tuple` observation space
      (nested; the same leaves): `batchrl.spaces.nested.FlatObservation`, Gymnasium's
      `FlattenObservation` (`Discrete` leaves one-hot) checked leaf by leaf and cast to
      float32; it declares a `FlatObservationSpace`, which tells the observation normalizer
      which elements come from `Box` leaves.
    - `Box` observation space of a dtype other than float32 and uint8:
      `DtypeObservation(env, np.float32)`, so observations are float32 arrays of the
      observation space's shape; a bool `Box` (binary frames) becomes uint8 instead.
      Observations of a uint8 `Box` (images) stay uint8, a byte an element in the batch
      and the memories (`batchrl.spaces.observation_dtype`).

    Args:
      env: a `gymnasium.Env`.
      max_episode_steps: optional positive int, the episode length limit in steps.

    Returns:
      The wrapped `gymnasium.Env` (`env` itself when no wrapper is needed).

    Raises:
      ValueError: the observation or action space has an unsupported leaf, or is an empty
        `Dict` / `Tuple` (the message names the leaf); or a deeper `TimeLimit` is shorter than
        `max_episode_steps`, so the new limit could never be reached; or `max_episode_steps`
        is not a positive int.
    """
    observation_space = env.observation_space
    action_space = env.action_space
    if not isinstance(observation_space, spaces.Box):
        try:
            nested.check_space(observation_space, "observation")
        except ValueError as error:
            raise ValueError(f"{error} ({env!r})") from None
    if not isinstance(action_space, spaces.Box | spaces.Discrete):
        try:
            nested.check_space(action_space, "action")
        except ValueError as error:
            raise ValueError(f"{error} ({env!r})") from None
    if max_episode_steps is not None:
        env = _time_limit(env, max_episode_steps)
    if (
        isinstance(action_space, spaces.Box)
        and np.all(np.isfinite(action_space.low))
        and (np.all(np.isfinite(action_space.high)))
    ):
        # Bounds of the action space's dtype, so that Gymnasium does not warn about precision.
        low = np.full(action_space.shape, -1.0, action_space.dtype)
        high = np.full(action_space.shape, 1.0, action_space.dtype)
        rescaled = gymnasium.wrappers.RescaleAction(env, low, high)
        env = gymnasium.wrappers.ClipAction(rescaled)
        env.action_space = rescaled.action_space
    elif isinstance(action_space, spaces.Discrete) and action_space.start != 0:
        env = gymnasium.wrappers.TransformAction(
            env, functools.partial(operator.add, action_space.start),
            spaces.Discrete(action_space.n))
    elif not isinstance(action_space, spaces.Box | spaces.Discrete):
        env = nested.UnflattenAction(env)
    if not isinstance(observation_space, spaces.Box):
        env = nested.FlatObservation(env)
    elif observation_space.dtype not in (np.float32, np.uint8):
        dtype = np.uint8 if observation_space.dtype == np.bool_ else np.float32
        with warnings.catch_warnings():
            # Lowering the precision of the bounds is the point here.
            warnings.filterwarnings("ignore", message=".*precision lowered", category=UserWarning)
            env = gymnasium.wrappers.DtypeObservation(env, dtype)
    return env


def _time_limit(env, max_episode_steps):
    """Gives `env` a time limit of `max_episode_steps` steps (see `standard_wrappers`)."""
    if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int | np.integer):
        raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
    max_episode_steps = int(max_episode_steps)
    if max_episode_steps <= 0:
        raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
    limits = []  # (depth, limit) of every TimeLimit in the wrapper chain, outermost first.
    inner, depth = env, 0
    while isinstance(inner, gymnasium.Wrapper):
        if isinstance(inner, gymnasium.wrappers.TimeLimit):
            limits.append((depth, inner._max_episode_steps))
        inner, depth = inner.env, depth + 1
    if limits and limits[0][0] == 0 and limits[0][1] != max_episode_steps:
        env = env.env  # Replace the outermost TimeLimit.
        limits = limits[1:]
    existing = [limit for _, limit in limits]
    if any(limit < max_episode_steps for limit in existing):
        raise ValueError(
            f"{env!r} already has a time limit of {min(existing)} steps inside other wrappers, "
            f"shorter than max_episode_steps={max_episode_steps}; build the environment with "
            "the wanted limit instead (e.g. gymnasium.make(id, max_episode_steps=...))"
        )
    if max_episode_steps in existing:
        return env
    return gymnasium.wrappers.TimeLimit(env, max_episode_steps)

"""This process's connection to Ray: starting a local Ray or joining a cluster for the
batches of `batchrl.environments.ray.driver`, and ending what they started (imports Ray
only when connecting).
"""

import contextlib
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading

__all__ = ["RayUnavailable", "connect", "disconnect"]

# The object store of a Ray that a batch starts itself: step results are small and travel
# inside Ray's replies, not through the store (larger observations, e.g. images, do).
_OBJECT_STORE_BYTES = 256 * 2**20

# Ray's settings of a local Ray that a batch starts: no idle workers started ahead of need.
# Ray 2.60 starts one per CPU when the first driver connects (`prestart_worker_first_driver`);
# the actor pool's actors cannot use them (their `runtime_env` differs from the default
# workers'), and each costs its imports (~1.3 CPU-s) and 78 MB while the trainer starts.
# Without them `cartpole_impala` printed its first step after 11.1 s against 11.8 s
# (medians of 5 alternating runs on 2 cores); the env backend's actors, which could use
# them, start on demand at the same cost.
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}

# The least time allowed for starting or joining Ray, in seconds: several times what a local
# start took on the loaded 2-core machine (docs/throughput.md, "Why the code is as it is").
START_SECONDS = 60.0


# The reaper of a local Ray's agents. Ray 2.60's raylet always starts a dashboard agent and
# a runtime-env agent (it requires both commands, ends when either ends, and the pool's
# `runtime_env` `env_vars` are set up by the runtime-env agent), and `ray.init` has no
# option against them. When the driver dies by SIGKILL, the processes Ray started from it
# die with it (PR_SET_PDEATHSIG), the workers within 3 s; the agents see their raylet die
# at once, then wait 60 s trying to tell the dead GCS so
# (`ray._private.utils.publish_error_to_driver`'s fixed timeout): about 165 MB for a
# minute (docs/faults.md, "SIGKILL of a trainer with Ray actors"). This process, started
# with the local Ray (argv: the driver's pid, then PID:STARTTIME of the raylet's children),
# asks the kernel for SIGTERM when the driver ends, and then SIGKILLs those that are still
# the same processes (their start time, field 22 of /proc/PID/stat, unchanged). It ignores
# SIGINT and SIGHUP, which reach the driver's whole process group; `disconnect` ends it
# with SIGTERM after `ray.shutdown`.
_REAPER = """
import ctypes, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() == int(sys.argv[1]):
    signal.sigwait({signal.SIGTERM})
for target in sys.argv[2:]:
    pid, start = target.split(":")
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[19] == start:
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""
_REAPERS = []  # The reaper of the local Ray that a batch started, while it runs.


class RayUnavailable(ConnectionError):
    """Ray is not installed, or the Ray cluster at the given address cannot be reached."""


# This process's connection to Ray, shared by its batches: whether a batch connected it
# (`ray.init`) and how many batches use it. The last batch to close disconnects what a
# batch connected, which stops a Ray that it started; a connection that was there before
# (e.g. the application's own `ray.init`) is left alone.
_CONNECTION = {"ours": False, "users": 0}
_CONNECTION_LOCK = threading.Lock()


def connect(address, seconds=START_SECONDS):
    """Connects this process to Ray: `address` None starts a local Ray (`ray.init("local")`,
    without the dashboard, without idle workers (`LOCAL_SYSTEM_CONFIG`) and on Linux with a
    reaper process, `_REAPER`, that kills Ray's agents when this process dies), "auto" or
    "HOST:PORT" joins a running cluster, giving up after `seconds`. Keeps the process's
    SIGTERM handler, which `ray.init` replaces. Returns the `ray` module. A process already
    connected (`ray.is_initialized()`, e.g. an application that called `ray.init` itself)
    keeps its connection, whatever `address` says.

    A cluster is joined from a helper thread, because `ray.init` retries an address that
    does not answer for minutes. A local Ray is started from the calling thread: Ray ties
    the life of the processes it starts to the thread that started them (Linux's
    parent-death signal), and they would end with a helper thread; so does the reaper."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("the Ray backend needs Ray: pip install 'batchrl[ray]'") from None
    with _CONNECTION_LOCK:
        if ray.is_initialized():
            _CONNECTION["users"] += 1
            return ray
        if address is None:
            what = "start a local Ray"
            options = dict(address="local", include_dashboard=False,
                           object_store_memory=_OBJECT_STORE_BYTES,
                           _system_config=LOCAL_SYSTEM_CONFIG)
        else:
            what = f"join the Ray cluster at {address!r}"
            options = dict(address=address)
            if address != "auto":
                _check_reachable(address)
        outcome = {}

        def init():
            try:
                ray.init(logging_level=logging.ERROR, **options)
            except Exception as error:  # noqa: BLE001 - handed to the caller.
                outcome["error"] = error

        handler = signal.getsignal(signal.SIGTERM)
        try:
            if address is None:
                init()
            else:
                thread = threading.Thread(target=init, name="batchrl-ray-init", daemon=True)
                thread.start()
                thread.join(seconds)
                if thread.is_alive():
                    raise RayUnavailable(f"cannot {what}: no answer within {seconds:g} s")
        finally:
            if threading.current_thread() is threading.main_thread() and handler is not None:
                signal.signal(signal.SIGTERM, handler)
        if "error" in outcome:
            error = outcome["error"]
            if type(error).__name__ == "AuthenticationError":
                raise RayUnavailable(
                    f"cannot {what}: the cluster wants its token: set RAY_AUTH_MODE=token, "
                    f"with the token in ~/.ray/auth_token or RAY_AUTH_TOKEN")
            detail = " ".join(str(error).split())[:300]
            raise RayUnavailable(f"cannot {what}: {type(error).__name__}: {detail}")
        _CONNECTION.update(ours=True, users=1)
        if address is None and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):  # Ray runs without it.
                _start_reaper()
        return ray


def _start_reaper():
    """Starts `_REAPER` for the children of this process's raylet (its two agents), which
    exist when `ray.init` returns."""
    targets = [f"{pid}:{start}" for raylet, _ in _children(os.getpid(), "raylet")
               for pid, start in _children(raylet)]
    _REAPERS.append(subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _REAPER, str(os.getpid()), *targets],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def _children(parent, name=None):
    """(pid, start time) of the processes whose parent is `parent` (and whose name, as
    /proc/PID/comm gives it, is `name`), from /proc/PID/stat (fields 4 and 22)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # It ended meanwhile.
            continue
        comm, _, fields = stat.rpartition(")")
        fields = fields.split()
        if len(fields) > 19 and int(fields[1]) == parent and (
                name is None or comm.partition("(")[2] == name):
            found.append((int(entry.name), fields[19]))
    return found


def _check_reachable(address, timeout=10.0):
    """Raises `RayUnavailable` when nothing accepts a connection at `address` ("HOST:PORT",
    optionally "ray://HOST:PORT") within `timeout` seconds: `ray.init` would retry for
    minutes."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: expected auto or "
                             f"HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: nothing answers "
                             f"there ({error.strerror or error})") from None


def disconnect():
    """Ends one batch's use of the connection; the last user disconnects a connection that a
    batch made (stopping a Ray it started, and its reaper; a joined cluster keeps
    running)."""
    with _CONNECTION_LOCK:
        _CONNECTION["users"] = max(0, _CONNECTION["users"] - 1)
        if _CONNECTION["users"] or not _CONNECTION["ours"]:
            return
        _CONNECTION["ours"] = False
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        while _REAPERS:
            reaper = _REAPERS.pop()
            reaper.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                reaper.wait(10)

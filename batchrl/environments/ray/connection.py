"""This process's connection to Ray: starting a local Ray or joining a cluster for the
batches of `batchrl.environments.ray.driver`, and ending what they started (imports Ray
only when connecting).
"""

import contextlib
import logging
import signal
import socket
import threading

__all__ = ["RayUnavailable", "connect", "disconnect"]

# The object store of a Ray that a batch starts itself: step results are small and travel
# inside Ray's replies, not through the store (larger observations, e.g. images, do).
_OBJECT_STORE_BYTES = 256 * 2**20

# The least time allowed for starting or joining Ray, in seconds: several times what a local
# start took on the loaded 2-core machine (docs/throughput.md, "Why the code is as it is").
START_SECONDS = 60.0


class RayUnavailable(ConnectionError):
    """Ray is not installed, or the Ray cluster at the given address cannot be reached."""


# This process's connection to Ray, shared by its batches: whether a batch connected it
# (`ray.init`) and how many batches use it. The last batch to close disconnects what a
# batch connected, which stops a Ray that it started; a connection that was there before
# (e.g. the application's own `ray.init`) is left alone.
_CONNECTION = {"ours": False, "users": 0}
_CONNECTION_LOCK = threading.Lock()


def connect(address, seconds=START_SECONDS):
    """Connects this process to Ray: `address` None starts a local Ray (`ray.init("local")`),
    "auto" or "HOST:PORT" joins a running cluster, giving up after `seconds`. Keeps the
    process's SIGTERM handler, which `ray.init` replaces. Returns the `ray` module.

    A cluster is joined from a helper thread, because `ray.init` retries an address that
    does not answer for minutes. A local Ray is started from the calling thread: Ray ties
    the life of the processes it starts to the thread that started them (Linux's
    parent-death signal), and they would end with a helper thread."""
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
                           object_store_memory=_OBJECT_STORE_BYTES)
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
        return ray


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
    batch made (stopping a Ray it started; a joined cluster keeps running)."""
    with _CONNECTION_LOCK:
        _CONNECTION["users"] = max(0, _CONNECTION["users"] - 1)
        if _CONNECTION["users"] or not _CONNECTION["ours"]:
            return
        _CONNECTION["ours"] = False
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()

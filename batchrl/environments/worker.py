"""`WorkerBatchEnv`: what the batches whose environments live in workers share (no
TensorFlow)."""

from batchrl.environments.base import BaseBatchEnv

__all__ = ["WorkerBatchEnv"]


class WorkerBatchEnv(BaseBatchEnv):
    """A `BaseBatchEnv` whose environments are hosted by `W` workers (processes or Ray
    actors), each a contiguous group of the batch, stepped in parallel; a failure closes
    the batch, and every later call raises naming why.

    A subclass sets, before it can fail: `_label` (str, the environments' name),
    `_groups` (list of `(first, count)` per worker), `_closed` (None while open, else
    why the batch was closed) and `_finalizer` (a `weakref.finalize` that releases the
    workers; idempotent).
    """

    def __repr__(self):
        return (f"{type(self).__name__}({self._label}, num_envs={self._num_envs}, "
                f"num_workers={len(self._groups)})")

    @property
    def blocking(self):
        """False: the workers step their environments in parallel."""
        return False

    @property
    def num_workers(self):
        """The number of workers `W` (int)."""
        return len(self._groups)

    @property
    def groups(self):
        """The batch indices each worker hosts: a tuple of `range`s, one per worker."""
        return tuple(range(first, first + count) for first, count in self._groups)

    def close(self):
        """Ends every worker (closing its environments) and frees what the batch holds.

        Idempotent; never raises for workers that already died.
        """
        self._close("the batch is closed")

    def _on_error(self, error, indices):
        """A non-finite result closes the batch."""
        self._fail(error)

    def _fail(self, error):
        """Closes the batch after a failure, then raises `error`."""
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        self._close(f"the batch was closed after an error: {first_line}")
        raise error

    def _close(self, why):
        if self._closed is None:
            self._closed = why
        self._finalizer()

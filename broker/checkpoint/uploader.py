"""The runtime's background uploader: checkpoints leave the training loop at once.

One worker thread uploads saves in the order they were made (so a later step never commits
before an earlier one). At most `max_pending` saves wait at a time: a save beyond that
blocks until the oldest finishes, so a slow store slows training down instead of filling
memory. Errors are kept on each save's handle (`PendingSave.result()` raises them) and
`flush()` reports them. The worker is joined at interpreter exit, so a job that returns
normally still commits its last checkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from broker.checkpoint.checkpoints import Manifest


class PendingSave:
    """A save in flight. `result()` waits for it: its Manifest (None for a non-zero rank)."""

    def __init__(self, step: int, future: Future[Manifest | None]) -> None:
        self.step = step
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Manifest | None:
        """Wait for the upload. Raises what the upload raised (CheckpointError, OSError, ...)
        or TimeoutError."""
        return self._future.result(timeout)

    def error(self) -> BaseException | None:
        """The upload's error once done (None: it succeeded or is still running)."""
        return self._future.exception() if self._future.done() else None


class Uploader:
    def __init__(self, max_pending: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onepool-upload")
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._pending: list[PendingSave] = []

    def submit(self, step: int, upload: Callable[[], Manifest | None]) -> PendingSave:
        """Queue an upload (blocks while `max_pending` are already queued)."""
        self._slots.acquire()
        fut = self._pool.submit(upload)
        fut.add_done_callback(lambda _: self._slots.release())
        p = PendingSave(step, fut)
        with self._lock:
            self._pending = [x for x in self._pending if not x.done()] + [p]
        return p

    def run(self, fn: Callable[[], None]) -> None:
        """Queue a small side job (no backpressure, no handle): e.g. a progress marker."""
        self._pool.submit(fn)

    def flush(self, timeout: float | None = None) -> list[PendingSave]:
        """Wait until every queued save is done; returns the ones that failed.
        Raises TimeoutError if they are not done in time."""
        with self._lock:
            pending, self._pending = self._pending, []
        _, not_done = wait_futures([p._future for p in pending], timeout)
        if not_done:
            with self._lock:
                self._pending = [p for p in pending if not p.done()] + self._pending
            raise TimeoutError(f"{len(not_done)} checkpoint upload(s) still running after {timeout}s")
        return [p for p in pending if p.error() is not None]

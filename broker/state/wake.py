"""Waking the broker loop when the queue changes (issue 27): a submit, a cancel or an update that
can change the plan should not wait out the rest of the cycle interval.

Two paths, both started by `Wake.poke()` (Store.changed() calls it after the commit):

- in-process: every listener added with `listen()` is called at once (`onepool server`: the
  broker loop's wake event, so a submit through the API starts the next cycle immediately);
- across processes on one home: the file `broker.wake` in the home is touched, and a broker
  loop in another process (`onepool broker` beside an embedded `onepool submit`, or beside a
  `onepool server --no-broker` on the same machine) sees it change by a stat every POLL_S
  while it waits between cycles: a change counter (each poke appends one byte; the watcher
  empties the file now and then, before the cycle it triggers) that costs one system call and
  no database query. A broker whose API processes share no filesystem with it (PostgreSQL
  across machines) sees their changes at its next cycle, as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("onepool.wake")
FILE = "broker.wake"
POLL_S = 0.05  # how often a waiting broker looks at the wake file
EMPTY_AT = 4096  # the watcher empties the file once it holds this many pokes


class Wake:
    """The queue-changed signal of one broker home."""

    def __init__(self, home: Path) -> None:
        self.path = home / FILE
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def listen(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call `fn()` (thread-safe, quick: it runs on the poking thread) at every poke in this
        process; returns a function that removes it."""
        with self._lock:
            self._listeners.append(fn)

        def remove() -> None:
            with self._lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)
        return remove

    def poke(self) -> None:
        """The queue changed: wake this process's listeners, and touch the wake file for the
        others. A home that cannot be written (a read-only client) only loses the cross-process
        wake: the broker sees the change at its next cycle, so the error is logged, not raised."""
        try:  # the file first: a listener's loop that looks at it then sees its own poke
            with open(self.path, "ab") as f:  # O_APPEND: concurrent pokes each add their byte
                f.write(b".")
        except OSError as e:
            log.debug("cannot touch %s (%s): a broker in another process wakes at its next cycle",
                      self.path, e)
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            fn()

    def stamp(self) -> tuple[int, int, int]:
        """The wake file's (inode, size, modification time in ns); zeros while never poked."""
        try:
            st = os.stat(self.path)
        except OSError:
            return (0, 0, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)


class WakeWatch:
    """A broker loop's view of the wake file: `poked()` is true once after each change."""

    def __init__(self, wake: Wake) -> None:
        self.wake = wake
        self._seen = wake.stamp()

    def poked(self) -> bool:
        """Whether the file changed since the last look (or since this watch was made)."""
        now = self.wake.stamp()
        if now == self._seen:
            return False
        if now[1] >= EMPTY_AT:  # a poke lost to this has committed already: the cycle sees it
            try:
                os.truncate(self.wake.path, 0)
            except OSError as e:
                log.debug("cannot empty %s (%s)", self.wake.path, e)
            now = self.wake.stamp()
        self._seen = now
        return True

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
  no database query;
- through PostgreSQL: Store.changed() also sends `NOTIFY onepool_wake`, and the broker's watch
  LISTENs on a connection of its own, so API processes on other machines wake it too (within
  POLL_S: the watch reads what arrived at each look, without a query).

The agents' long polls get the same two cross-process paths (`agents.wake`, `onepool_agents`):
the leader pokes them after writing an assignment or a signal (Store.agents_changed()), and an
API process without a broker of its own (`onepool server --no-broker`) watches them and wakes
every waiting poll (broker.api.app), which then reads the database once. An API process with
its broker in-process hears its engine directly (the mailbox) and does not watch.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

log = logging.getLogger("onepool.wake")
FILE = "broker.wake"
AGENTS_FILE = "agents.wake"
AGENTS_CHANNEL = "onepool_agents"
POLL_S = 0.05  # how often a waiting broker looks at the wake file
CHANNEL = "onepool_wake"  # PostgreSQL's LISTEN/NOTIFY channel
EMPTY_AT = 4096  # the watcher empties the file once it holds this many pokes


class Wake:
    """The queue-changed signal of one broker home."""

    def __init__(self, home: Path, name: str = FILE) -> None:
        self.path = home / name
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


def notify(engine: Engine, channel: str = CHANNEL) -> None:
    """Send the PostgreSQL wake-up (nothing on SQLite). The change is committed already, so a
    failure is logged, not raised: the broker sees the change at its next cycle."""
    if engine.dialect.name != "postgresql":
        return
    try:
        with engine.begin() as c:
            c.execute(text(f"NOTIFY {channel}"))
    except DBAPIError as e:
        log.warning("could not wake the broker through the database (%s): it sees the change at "
                    "its next cycle", e)


class WakeWatch:
    """A broker loop's view of the wake file (and, on PostgreSQL, of the wake channel):
    `poked()` is true once after each change. `close()` when done."""

    def __init__(self, wake: Wake, engine: Engine | None = None, channel: str = CHANNEL) -> None:
        self.wake, self.channel = wake, channel
        self._seen = wake.stamp()
        self._pg = engine if engine is not None and engine.dialect.name == "postgresql" else None
        self._listener: Any = None  # the pool connection that LISTENs (invalidated at close)
        if self._pg is not None:
            try:
                self._listen()
            except Exception as e:  # noqa: BLE001  (the database is down: listens at a later look)
                log.warning("cannot listen on the wake channel yet (%s)", e)

    def _listen(self) -> None:
        assert self._pg is not None
        raw = self._pg.raw_connection()
        try:
            conn = raw.driver_connection
            conn.autocommit = True  # type: ignore[union-attr]
            conn.execute(f"LISTEN {self.channel}")  # type: ignore[union-attr]
        except Exception:
            raw.invalidate()
            raise
        self._listener = raw

    def _heard(self) -> bool:
        """Whether a NOTIFY arrived since the last look (all of them are read). A lost
        connection counts as heard (one extra cycle) and is opened again at the next look."""
        if self._pg is None:
            return False
        try:
            if self._listener is None:
                self._listen()
            return sum(1 for _ in self._listener.driver_connection.notifies(timeout=0)) > 0
        except Exception as e:  # noqa: BLE001  (psycopg's errors: the broker cycles, then listens again)
            log.warning("the wake channel failed (%s): listening again", e)
            self.close()
            return True

    def close(self) -> None:
        if self._listener is not None:
            self._listener.invalidate()  # never back to the pool: it LISTENs
            self._listener = None

    def poked(self) -> bool:
        """Whether the file changed (or, on PostgreSQL, a NOTIFY came) since the last look."""
        if self._heard():
            self._seen = self.wake.stamp()
            return True
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

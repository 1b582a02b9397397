"""The agent's threads (broker.agent.agent.Agent runs them): each loop, its retries and
backoff, the exit status when one cannot go on, and AgentError, which stops the agent.

AgentLoops is a mixin of Agent: it uses the agent's state (stop, error, retry_s, retry_max_s,
changed, lock, ranks, watcher, util, node, heartbeat_s, reported_notices) and its steps (join,
adopt, sync, ship, notice, sample_utilization, _one), all defined in broker.agent.agent.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import httpx

from broker.agent.gpu_util import SAMPLE_S

if TYPE_CHECKING:
    from broker.agent.agent import Rank
    from broker.agent.gpu_util import Reader
    from broker.agent.metadata import Watcher

log = logging.getLogger("onepool.agent")
LOOP_FAILURES = 5  # failures in a row of one loop, other than the server's, before the agent exits


class AgentError(Exception):
    """The agent cannot go on (bad or used join token, credential revoked, node retired:
    `refused`; or its own loops keep failing)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class AgentLoops:
    """The loops of a node agent (see the module docstring for what it needs of Agent)."""

    # what the loops read of the agent's state (set by Agent)
    stop: threading.Event
    changed: threading.Event
    lock: threading.RLock
    error: AgentError | None
    retry_s: float
    retry_max_s: float
    node: str
    heartbeat_s: float
    reported_notices: set[str]

    if TYPE_CHECKING:  # the agent's steps the loops call (broker.agent.agent.Agent)
        ranks: dict[int, Rank]
        watcher: Watcher | None
        util: Reader | None

        def join(self) -> None: ...
        def adopt(self) -> None: ...
        def sync(self, wait_s: float) -> None: ...
        def ship(self, rk: Rank) -> None: ...
        def notice(self, kind: str, deadline: float | None, detail: str) -> None: ...
        def sample_utilization(self) -> None: ...
        def _one(self, rk: Rank, what: str) -> AbstractContextManager[None]: ...

    def _loop(self, what: str, every: float, fn: Any, outside: bool = False) -> None:
        """Run fn() until stopped. The server being unreachable, failing or throttling
        (transport errors, 5xx, 408, 429) is retried with backoff (from retry_s up to
        retry_max_s), without end: the ranks' fence covers a long outage; so is any HTTP
        error of a service `outside` this agent and the server (the cloud's metadata service:
        its being down must not take the node's work down). AgentError (refused)
        stops the agent; so do LOOP_FAILURES failures in a row of anything else (its state
        folder unwritable, a bug): it exits non-zero and its supervisor (systemd) restarts it,
        which adopts the running ranks."""
        backoff, failures = self.retry_s, 0
        while not self.stop.is_set():
            try:
                fn()
                backoff, failures = self.retry_s, 0
            except AgentError as e:
                self._fatal(e)
                return
            except Exception as e:
                server = isinstance(e, httpx.TransportError) or (  # busy, down or throttling
                    isinstance(e, httpx.HTTPStatusError) and (e.response.status_code >= 500
                                                              or e.response.status_code in (408, 429)))
                server = server or (outside and isinstance(e, httpx.HTTPError))
                if not server:
                    failures += 1
                    log.exception("agent: %s failed (%d in a row)", what, failures)
                    if failures >= LOOP_FAILURES:
                        self._fatal(AgentError(f"{what} failed {failures} times in a row (last: "
                                               f"{type(e).__name__}: {e}): exiting, to be restarted"))
                        return
                else:
                    log.warning("agent: %s failed (%s); retrying in %.1fs", what, e, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            if every:
                self.stop.wait(every)

    def _fatal(self, e: AgentError) -> None:
        log.error("agent: %s", e)
        self.error = self.error or e
        self.stop.set()

    def _thread(self, what: str, every: float, fn: Any, outside: bool = False) -> None:
        """A loop's thread: if it ends while the agent runs (an error escaped the loop itself),
        the agent stops with an error: never a process that stays up with a dead loop."""
        try:
            self._loop(what, every, fn, outside)
        except BaseException as e:
            log.critical("agent: the %s loop died", what, exc_info=True)
            self._fatal(AgentError(f"the {what} loop died ({type(e).__name__}: {e})"))
            return
        if not self.stop.is_set():
            self._fatal(AgentError(f"the {what} loop ended"))

    def _report_on_change(self) -> None:
        if self.changed.wait(1.0):
            self.changed.clear()
            self.sync(0.0)

    def _ship_all(self) -> None:
        with self.lock:
            ranks = list(self.ranks.values())
        for rk in ranks:
            with self._one(rk, "ship its output"):
                self.ship(rk)

    def _watch(self) -> None:
        assert self.watcher is not None
        for n in self.watcher.poll():
            if n.kind not in self.reported_notices:
                log.warning("agent: %s notice from the metadata service", n.kind)
                self.notice(n.kind, n.deadline, n.detail)
                self.reported_notices.add(n.kind)

    def run(self) -> int:
        """Join, adopt, then serve until stopped (SIGTERM/SIGINT: ranks keep running and are
        adopted by the next agent). Returns the exit status: 0; 3 when the server refused this
        agent; 4 when it cannot go on (a loop failed LOOP_FAILURES times in a row, or died)."""
        backoff = self.retry_s
        while not self.stop.is_set() and not self.node:
            try:
                self.join()
            except AgentError as e:
                log.error("agent: %s", e)
                return 3
            except (httpx.HTTPError, OSError, ValueError) as e:
                log.warning("agent: cannot join yet (%s); retrying in %.1fs", e, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.retry_max_s)
        if not self.node:
            return 0
        self.adopt()
        threads = [threading.Thread(target=self._thread, args=(n, e, f, o), daemon=True, name=n)
                   for n, e, f, o in (
            ("sync", 0.0, lambda: self.sync(self.heartbeat_s), False),
            ("report", 0.0, self._report_on_change, False),
            ("ship logs", 1.0, self._ship_all, False),
            *([("metadata", 2.0, self._watch, True)] if self.watcher else []),
            *([("gpu utilization", SAMPLE_S, self.sample_utilization, True)] if self.util else []))]
        for t in threads:
            t.start()
        while not self.stop.wait(0.5):
            if dead := [t.name for t in threads if not t.is_alive()]:
                self._fatal(AgentError(f"the {', '.join(dead)} loop is gone"))
        for t in threads:
            t.join(timeout=2.0)
        return self.exit_status()

    def exit_status(self) -> int:
        """0 (stopped), 3 (the server refused this agent) or 4 (it cannot go on)."""
        if self.error is None:
            return 0
        return 3 if self.error.refused else 4

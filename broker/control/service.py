"""The long-running broker: reconcile once, then cycle until told to stop.

Cycles run every `cycle_s`, and at once when a job process exits or an agent reports (no
waiting out the interval to notice a finished job). SIGTERM/SIGINT stop the loop after the
current cycle; jobs keep running, and the next broker adopts them.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from broker.clock import Clock
from broker.control.engine import CycleReport, Engine
from broker.control.executors import Executors
from broker.state.store import Store

log = logging.getLogger("onepool.broker")


class BrokerLoop:
    """The engine with its executors and the events that pace it. `notify(node)` is called
    when a node's agent has something new (the API's mailbox, in `onepool server`)."""

    def __init__(self, store: Store, clock: Clock, *, cycle_s: float | None = None,
                 notify: Callable[[str], None] | None = None) -> None:
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.executors = Executors(store, clock, store.home / "runs", on_change=self.wake.set,
                                   notify=notify)
        self.engine = Engine(store, clock, self.executors)
        self.interval = cycle_s or self.engine.settings.cycle_s
        self.store = store

    def request_stop(self) -> None:
        self.stop.set()
        self.wake.set()

    def run(self, max_cycles: int | None = None) -> int:
        """Reconcile, then cycle until stopped; returns the number of cycles run."""
        self.engine.reconcile()
        log.info("broker up: home %s, cycle %.3gs", self.store.home, self.interval)
        n = 0
        while not self.stop.is_set():
            describe(self.engine.cycle())
            n += 1
            if max_cycles is not None and n >= max_cycles:
                break
            self.wake.wait(self.interval)
            self.wake.clear()
        log.info("broker stopping after %d cycles; running jobs continue", n)
        return n


def run(store: Store, clock: Clock, *, cycle_s: float | None = None,
        stop: threading.Event | None = None, max_cycles: int | None = None) -> int:
    """Run the broker loop in this thread; returns the number of cycles run."""
    loop = BrokerLoop(store, clock, cycle_s=cycle_s)
    if stop is not None:
        loop.stop = stop
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: loop.request_stop())
    return loop.run(max_cycles)


def describe(rep: CycleReport) -> None:
    for j in rep.preempted:
        log.info("job %s: preempting", j)
    for j in rep.killed:
        log.info("job %s: killed after grace", j)
    for j, why in rep.ended:
        log.info("job %s: attempt ended %s", j, why)
    for j in rep.started:
        log.info("job %s: started", j)

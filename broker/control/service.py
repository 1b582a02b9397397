"""The long-running broker: reconcile once, then cycle until told to stop.

Cycles run every `cycle_s`, and at once when a job process exits (no waiting out the
interval to notice a finished job). SIGTERM/SIGINT stop the loop after the current cycle;
jobs keep running, and the next broker adopts them.
"""

from __future__ import annotations

import logging
import signal
import threading

from broker.clock import Clock
from broker.control.engine import CycleReport, Engine
from broker.state.store import Store
from providers.local import LocalProcesses

log = logging.getLogger("onepool.broker")


def run(store: Store, clock: Clock, *, cycle_s: float | None = None,
        stop: threading.Event | None = None, max_cycles: int | None = None) -> int:
    """Run the broker loop; returns the number of cycles run."""
    wake = threading.Event()
    stop = stop or threading.Event()
    executor = LocalProcesses(store.home / "runs", on_change=wake.set)
    engine = Engine(store, clock, executor)
    interval = cycle_s or engine.settings.cycle_s
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (stop.set(), wake.set()))
    engine.reconcile()
    log.info("broker up: home %s, cycle %.3gs", store.home, interval)
    n = 0
    while not stop.is_set():
        describe(engine.cycle())
        n += 1
        if max_cycles is not None and n >= max_cycles:
            break
        wake.wait(interval)
        wake.clear()
    log.info("broker stopping after %d cycles; running jobs continue", n)
    return n


def describe(rep: CycleReport) -> None:
    for j in rep.preempted:
        log.info("job %s: preempting", j)
    for j in rep.killed:
        log.info("job %s: killed after grace", j)
    for j, why in rep.ended:
        log.info("job %s: attempt ended %s", j, why)
    for j in rep.started:
        log.info("job %s: started", j)

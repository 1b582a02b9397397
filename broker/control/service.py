"""The long-running broker: stand by until it holds the leader lease, reconcile, then cycle
until told to stop. Any long-running broker loop (`onepool broker`, `onepool server`) runs
this same `run()`.

While it leads (not with `--once`), a thread sends the teams' webhooks (broker.control.notify).

Periodic tasks (refresh prices, rebalance, scale down idle rented nodes, sweep orphans,
enforce budgets, decay fair-share usage, checkpoint retention) run on the leader's
APScheduler schedule, kept in the database (broker.control.scheduled), on this loop's thread
between cycles; while it leads, its engine's cycles leave those duties to the schedule.
`--once` (max_cycles) keeps the schedule but runs the duties in its cycles, as an engine
cycled directly does: it may never wait for one to come due.

Cycles run every `cycle_s`, and at once when a job process exits (no waiting out the
interval to notice a finished job). The lease is renewed after every cycle and while
waiting between cycles. A broker that loses the lease (another took over after it paused)
drops its engine and stands by again. SIGTERM/SIGINT stop the loop after the current cycle
and give the lease back, so a standby takes over at once; jobs keep running, and the next
leader adopts them.

A cycle that fails with an unexpected error is logged with its traceback and retried after
a back-off; the health view (`onepool health`) shows the age of the last good cycle.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import OperationalError

from broker.clock import Clock
from broker.control.config_apply import applied_config
from broker.control.engine import CycleReport, Engine
from broker.control.executors import Executors
from broker.control.lease import Lease, lease_row
from broker.control.notify import Notifier
from broker.control.scheduled import TaskScheduler
from broker.errors import LeaseLost, NotLeader
from broker.observe.logs import context
from broker.state.store import Store
from broker.state.wake import POLL_S, WakeWatch
from providers.base import Executor

log = logging.getLogger("onepool.broker")
MAX_BACKOFF_S = 30.0


def run(store: Store, clock: Clock, *, cycle_s: float | None = None,
        stop: threading.Event | None = None, max_cycles: int | None = None,
        executor: Executor | None = None, wake: threading.Event | None = None,
        notify: Callable[[str], None] | None = None) -> int:
    """Run the broker loop; returns the number of cycles this process ran.

    Without `max_cycles` it stands by while another broker holds the lease. With
    `max_cycles` (`onepool broker --once`) it raises NotLeader instead of waiting.
    `executor` defaults to the home's local slots and the node agents (Executors); `wake`
    (set when a local process exits or an agent reports) cuts the wait between cycles short;
    `notify(node)` tells a node's agent to look at once (the API's mailbox, in `onepool
    server`). A change to the queue (Store.changed(): a submit, a cancel, a budget, a config)
    wakes it too: at once from this process, within POLL_S from another on the same home.
    """
    wake = wake or threading.Event()
    stop = stop or threading.Event()
    unlisten = store.wake.listen(wake.set)
    if executor is None:
        tell = notify

        def notify_agents(node: str) -> None:  # this process's API at once, the others' too
            if tell is not None:
                tell(node)
            store.agents_changed()
        executor = Executors(store, clock, store.home / "runs", on_change=wake.set, notify=notify_agents)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (stop.set(), wake.set()))
    with store.session() as s:
        settings = applied_config(s).broker
    lease = Lease(store, clock, settings.lease_s)
    n, standing_by = 0, False
    try:
        while not stop.is_set():
            if not lease.try_acquire():
                if max_cycles is not None:
                    row = lease_row(store)
                    raise NotLeader(f"broker {row.holder} holds the lease (fencing number "
                                    f"{row.fencing}); --once runs only on the leader")
                if not standing_by:
                    row = lease_row(store)
                    log.info("standby: broker %s leads (fencing number %s)", row.holder, row.fencing)
                    standing_by = True
                stop.wait(lease.poll_s)
                continue
            standing_by = False
            n += _lead(store, clock, executor, lease, cycle_s, stop, wake, max_cycles, n)
            if max_cycles is not None and n >= max_cycles:
                break
    finally:
        unlisten()
        if lease.held:
            lease.release()
    log.info("broker stopping after %d cycles; running jobs continue", n)
    return n


def _lead(store: Store, clock: Clock, executor: Executor, lease: Lease, cycle_s: float | None,
          stop: threading.Event, wake: threading.Event, max_cycles: int | None, done: int) -> int:
    """Cycles as the leader until stopped or the lease is lost; returns how many ran."""
    n, failures = 0, 0
    engine: Engine | None = None
    tasks: TaskScheduler | None = None
    notifier: Notifier | None = None
    notifying: threading.Thread | None = None
    stop_notifier = threading.Event()
    watch: WakeWatch | None = None
    try:
        engine = Engine(store, clock, executor, lease=lease)
        engine.wake = wake.set
        interval = cycle_s or engine.settings.cycle_s
        log.info("leader: fencing number %s, home %s, cycle %.3gs", lease.fencing, store.home, interval)
        tasks = TaskScheduler(store, engine.settings, wake.set)  # [issue 12] the leader's schedule
        tasks.start()
        if max_cycles is None:
            tasks.attach(engine)  # the duties run as tasks, no longer in every cycle
            notifier = Notifier(store, clock)  # [issue 30] webhooks, off the cycle's thread
            notifying = threading.Thread(target=notifier.run, args=(stop_notifier,), daemon=True,
                                         name="webhooks")
            notifying.start()
        reconciled = False
        watch = WakeWatch(store.wake, store.engine)
        while not stop.is_set():
            try:
                if not reconciled:
                    engine.reconcile()
                    reconciled = True
                tasks.run_due(engine)  # periodic tasks due now, on this thread, between cycles
                describe(engine.cycle())
                lease.renew(cycled=True)
                n, failures = n + 1, 0
            except (LeaseLost, NotLeader):
                raise
            except OperationalError as e:  # the database is unreachable or locked: retry
                failures += 1
                log.warning("cycle failed: database unavailable (%s); retrying", e)
            except Exception:  # a bug: logged with its traceback; the loop backs off, retries
                failures += 1
                log.exception("cycle failed; retrying after a back-off")
            if max_cycles is not None and done + n >= max_cycles:
                break
            pause = interval if not failures else min(MAX_BACKOFF_S, interval * 2 ** failures)
            _pause(lease, stop, wake, watch, pause)
    except LeaseLost as e:
        log.warning("%s: standing by", e)
    finally:
        if watch is not None:
            watch.close()
        stop_notifier.set()
        if notifying is not None:
            notifying.join(timeout=10)  # a delivery in flight ends within its 5 s timeout
        if notifier is not None:
            notifier.close()
        if tasks is not None:
            tasks.shutdown()
        if engine is not None:
            engine.close()
    return n


def _pause(lease: Lease, stop: threading.Event, wake: threading.Event, watch: WakeWatch,
           seconds: float) -> None:
    """Wait `seconds`, or until woken (the event, or the home's wake file changed by another
    process: looked at every POLL_S), renewing the lease every lease_s / 3 meanwhile."""
    deadline = time.monotonic() + seconds
    renew_at = time.monotonic() + lease.lease_s / 3
    while not stop.is_set():
        now = time.monotonic()
        if now >= deadline:
            return
        if wake.wait(min(deadline - now, POLL_S)):
            wake.clear()
            watch.poked()  # this process's own poke (if any) was just heard through the event
            return
        if watch.poked():
            return
        if time.monotonic() >= renew_at:
            lease.ensure()
            renew_at = time.monotonic() + lease.lease_s / 3


def describe(rep: CycleReport) -> None:
    """Log what a cycle did, one line per job (JSON logs carry the job as a field)."""
    for j in rep.preempted:
        log.info("job %s: preempting", j, extra=context(job=j))
    for j in rep.killed:
        log.info("job %s: killed after grace", j, extra=context(job=j))
    for j, why in rep.ended:
        log.info("job %s: attempt ended %s", j, why, extra=context(job=j))
    for j in rep.started:
        log.info("job %s: started", j, extra=context(job=j))

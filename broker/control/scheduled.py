"""The leader's periodic tasks on APScheduler, with their schedule persisted in the broker's
own database (SQLAlchemyJobStore, table `apscheduler_jobs`, created by migration 0011).

Contract:

- Only the lease holder schedules: broker.control.service starts a `TaskScheduler` when it
  becomes the leader and shuts it down when it stops leading. The schedule (each task's next
  run time) is in the database, so a new leader continues it: a task that came due while no
  broker led runs once at once (coalesced), not once per missed interval.
- Tasks run on the broker loop's thread, between cycles (`run_due`), never beside a cycle:
  APScheduler decides WHEN (its executor here only queues the task and wakes the loop), the
  loop runs it with the engine and the injected clock. The engine is not thread-safe, and
  a task acts only while the lease is held.
- A task that raises is logged with its traceback; it stays scheduled and runs again at its
  next time. A lost lease (LeaseLost, NotLeader) is not a task failure: it propagates.
- Intervals come from onepool.yaml (`broker.tasks.<task>_s`, broker.spec.TaskIntervals); a
  changed interval replaces the stored schedule, an unchanged one keeps it. A fresh schedule
  first runs each task one interval after it starts.

Tasks (`TASKS`): refresh_prices (broker.control.prices), rebalance (moves and
defragmentation: broker.control.rebalancer; skipped while broker.rebalance.enabled is
false), and the engine's duties (broker.control.duties): scale_down, sweep_orphans,
enforce_budgets, decay_fair_share, retain_checkpoints. Each duty is ONE engine method: the
leader's loop `attach()`es the schedule to its engine, and from then on its cycles leave the
duties to their tasks (Engine.duties_scheduled); an engine no schedule drives (the tests,
`onepool broker --once`) runs them in every cycle. The ledger is charged in every cycle
either way; only budget enforcement is scheduled. Orphan sweeps stay on each pool's cloud
worker thread: the task asks for one (no cloud call on the loop's thread).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from broker.errors import LeaseLost, NotLeader
from broker.spec import BrokerSettings

if TYPE_CHECKING:
    from broker.control.engine import Engine
    from broker.state.store import Store

log = logging.getLogger("onepool.tasks")
TABLE = "apscheduler_jobs"


def _refresh_prices(engine: Engine, now: float) -> None:
    engine.capacity.refresh_prices(now)


def _rebalance(engine: Engine, now: float) -> None:
    if engine.settings.rebalance.enabled:
        engine.rebalancer.decide(now)


Task = tuple[Callable[[BrokerSettings], float], Callable[["Engine", float], None]]

# name -> (its interval from the settings, what it runs). Each duty is the engine method the
# cycle itself runs when no schedule drives the duties (Engine.duties_scheduled false).
TASKS: dict[str, Task] = {
    "refresh_prices": (lambda b: b.tasks.refresh_prices_s, _refresh_prices),
    "rebalance": (lambda b: b.tasks.rebalance_s, _rebalance),
    "scale_down": (lambda b: b.tasks.scale_down_s, lambda e, now: e.scale_down(now)),
    "sweep_orphans": (lambda b: b.tasks.sweep_orphans_s, lambda e, now: e.sweep_orphans(now)),
    "enforce_budgets": (lambda b: b.tasks.enforce_budgets_s, lambda e, now: e.enforce_budgets(now)),
    "decay_fair_share": (lambda b: b.tasks.decay_fair_share_s, lambda e, now: e.decay_fair_share(now)),
    "retain_checkpoints": (lambda b: b.tasks.retain_checkpoints_s,
                           lambda e, now: e.retain_checkpoints(now)),
}


def due_task(name: str) -> None:
    """The callable APScheduler stores for every task (by reference). Never called: the
    loop runs tasks (see `_Queue`); it exists so the stored job names something real."""
    raise RuntimeError(f"task {name} runs on the broker loop (TaskScheduler.run_due)")


class _Queue(BaseExecutor):
    """An APScheduler executor that hands due tasks to the broker loop instead of running
    them in a thread pool, and wakes the loop."""

    def __init__(self, wake: Callable[[], None]) -> None:
        super().__init__()
        self.due: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.wake = wake

    def _do_submit_job(self, job: Any, run_times: list[Any]) -> None:
        self.due.put(job.args[0])
        self._run_job_success(job.id, [])
        self.wake()


class TaskScheduler:
    """The leader's schedule. start() when leading; run_due() from the loop; shutdown()."""

    def __init__(self, store: Store, settings: BrokerSettings, wake: Callable[[], None] = lambda: None
                 ) -> None:
        self.settings = settings
        self.executor = _Queue(wake)
        self.ran = threading.Event()  # set after every run_due() that ran a task (tests await it)
        self._engine: Engine | None = None  # the engine whose duties this drives (attach)
        self.scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(engine=store.engine, tablename=TABLE)},
            executors={"default": self.executor}, timezone="UTC",
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})

    def start(self) -> None:
        """Load the stored schedule and (re)schedule every task whose interval changed."""
        self.scheduler.start(paused=True)
        for name, (interval_of, _) in TASKS.items():
            every = timedelta(seconds=interval_of(self.settings))
            job = self.scheduler.get_job(name)
            if job is None or getattr(job.trigger, "interval", None) != every:
                self.scheduler.add_job(due_task, "interval", args=[name], id=name, name=name,
                                       seconds=every.total_seconds(), replace_existing=True)
        self.scheduler.resume()

    def next_runs(self) -> dict[str, Any]:
        """Each task's next run time (UTC datetimes), as stored."""
        return {j.id: j.next_run_time for j in self.scheduler.get_jobs()}

    def run_due(self, engine: Engine) -> list[str]:
        """Run every task APScheduler found due, on this thread, with the engine's clock.
        Returns the names run (failed ones included: logged, retried at their next time)."""
        ran = []
        while True:
            try:
                name = self.executor.due.get_nowait()
            except queue.Empty:
                break
            ran.append(name)
            try:
                TASKS[name][1](engine, engine.clock.now())
            except (LeaseLost, NotLeader):
                raise
            except Exception:  # a task's failure is its own: logged, retried at its next run
                log.exception("task %s failed; it runs again at its next time", name)
        if ran:
            self.ran.set()
        return ran

    def attach(self, engine: Engine) -> None:
        """From now on this schedule drives the engine's duties: its cycle no longer runs them
        (Engine.duties_scheduled)."""
        engine.duties_scheduled = True
        self._engine = engine

    def shutdown(self) -> None:
        """Stop scheduling; an attached engine runs its duties in its cycle again."""
        if self._engine is not None:
            self._engine.duties_scheduled = False
            self._engine = None
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

"""How one attempt's failure stays its own (the engine's guards; Engine inherits them).

- `_contained(step, attempt)`: any error while handling one attempt (reconcile, poll,
  preempt, cancel) other than a failure of the broker itself (lease lost, database down:
  BROKER_FAILURES, handled by the loop) is logged with its traceback and fails only that
  attempt: killed, FAILED with cause "broker_error", the error in its events. A second
  failure ends it at once; a third quarantines it (skipped, holding its GPUs, until the
  broker restarts), so no row can stop the broker.
- `_start_or_fail`: a rank that cannot start (StartFailed: a working directory that
  vanished, a NUL byte in its command) fails its attempt with cause "start_failed".
- `_previous_alive`: no attempt starts while a process of the job's previous one lives.
- `_launch_deferred`: an error before the attempt row is written leaves the job pending,
  the reason shown as why it waits.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from broker.clock import Clock
from broker.errors import LeaseLost, NotLeader
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, EndReason, Job, JobState
from providers.base import Executor, RankState, StartFailed

if TYPE_CHECKING:
    from broker.control.lease import FencedStore
    from broker.state.store import Store

log = logging.getLogger("onepool.engine")
BROKER_CAUSES = ("start_failed", "broker_error")  # FAILED for a reason other than its exit code
# Failures of the broker itself, never contained per attempt: the loop (service.run) handles them.
BROKER_FAILURES = (LeaseLost, NotLeader, OperationalError)


class AttemptGuards:
    store: Store | FencedStore
    clock: Clock
    executor: Executor
    _quarantined: set[int]

    if TYPE_CHECKING:  # provided by Engine
        def _end(self, s: Session, a: Attempt, now: float, reason: EndReason, code: int | None,
                 cause: str | None = None) -> None: ...

        def _start_ranks(self, a: Attempt, job: Job, *, recover: bool) -> None: ...

    def _open_attempts(self, states: tuple[str, ...] | None = None) -> list[int]:
        """Ids of attempts not ENDED (or in `states`), minus those quarantined."""
        with self.store.session() as s:
            q = select(Attempt.id).where(Attempt.state != AttemptState.ENDED)
            if states is not None:
                q = q.where(col(Attempt.state).in_(states))
            return [i for i in s.exec(q.order_by(Attempt.id)).all() if i not in self._quarantined]

    @contextmanager
    def _contained(self, step: str, attempt_id: int | None) -> Iterator[None]:
        """Run one attempt's step. A failure of the broker itself (lease lost, database
        unreachable) propagates; any other error is logged with its traceback and ends only
        that attempt (killed, FAILED, the error in its events), and the cycle goes on."""
        try:
            yield
        except BROKER_FAILURES:
            raise
        except Exception as e:
            log.exception("attempt %s: %s failed", attempt_id, step)
            if attempt_id is not None:
                self._fail_attempt(attempt_id, f"{step}: {type(e).__name__}: {e}")

    def _fail_attempt(self, attempt_id: int, why: str) -> None:
        """Stop an attempt the broker could not handle: SIGKILL, then FAILED once its processes
        are gone. A second failure ends it at once; a third quarantines it (skipped, holding
        its GPUs, until this broker restarts)."""
        now = self.clock.now()
        try:
            with self.store.session() as s:
                a = s.get(Attempt, attempt_id)
                if a is None or a.state == AttemptState.ENDED:
                    return
                record(s, now, "attempt_error", f"attempt {a.number}: the broker failed to {why}; "
                       "it is stopped and fails", job_id=a.job_id, attempt_id=a.id, error=why[:500])
                if a.cause == "broker_error":  # failed again while stopping: end it now
                    self._end(s, a, now, EndReason.FAILED, None, cause="broker_error")
                    return
                a.state, a.stop_requested_at, a.stop_reason, a.cause = (
                    AttemptState.STOPPING, now, "failed", "broker_error")
                s.add(a)
            for h in a.handles:
                try:
                    self.executor.signal(h, signal.SIGKILL)
                except Exception:  # a handle the executor cannot read: logged, the rest go on
                    log.exception("attempt %s: cannot kill rank %s", attempt_id, h)
        except BROKER_FAILURES:
            raise
        except Exception:
            log.exception("attempt %s: cannot even record its failure; quarantined", attempt_id)
            self._quarantined.add(attempt_id)

    def _start_or_fail(self, s: Session, a: Attempt, job: Job, now: float, *, recover: bool) -> bool:
        """Start the attempt's ranks. False if one cannot start (StartFailed: a working
        directory that vanished, ...): the started ones are killed and the attempt fails."""
        try:
            self._start_ranks(a, job, recover=recover)
            return True
        except StartFailed as e:
            record(s, now, "start_failed", f"attempt {a.number} could not start: {e}",
                   job_id=job.id, attempt_id=a.id, error=str(e)[:500])
            a.state, a.stop_requested_at, a.stop_reason, a.cause = (
                AttemptState.STOPPING, now, "failed", "start_failed")
            s.add(a)
            s.commit()
            for h in a.handles:
                self.executor.signal(h, signal.SIGKILL)
            return False

    def _previous_alive(self, s: Session, job: Job, now: float) -> bool:
        """True (and the leftovers killed) while any process of the job's last attempt lives:
        a new attempt never starts beside an old one."""
        prev = s.exec(select(Attempt).where(Attempt.job_id == job.id)
                      .order_by(col(Attempt.number).desc())).first()
        if prev is None:
            return False
        alive = [h for h in prev.handles
                 if self.executor.status(h).state in (RankState.RUNNING, RankState.ORPHANED)]
        for h in alive:
            self.executor.signal(h, signal.SIGKILL)
        why = f"waiting for the processes of attempt {prev.number} to end"
        if alive and job.waiting_reason != why:
            job.waiting_reason = why
            record(s, now, "previous_attempt_alive", f"{why}: killed", job_id=job.id,
                   attempt_id=prev.id)
            s.add(job)
        return bool(alive)

    def _launch_deferred(self, job_id: int, now: float, why: str) -> None:
        with self.store.session() as s:
            job = s.get(Job, job_id)
            reason = f"cannot start now ({why[:300]}); retried next cycle"
            if job is not None and job.state == JobState.PENDING and job.waiting_reason != reason:
                job.waiting_reason = reason
                record(s, now, "launch_deferred", reason, job_id=job_id)
                s.add(job)

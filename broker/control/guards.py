"""How one attempt's failure stays its own (the engine's guards; Engine inherits them).

- `_contained(step, attempt)`: any error while handling one attempt (reconcile, poll,
  preempt, cancel) other than a failure of the broker itself (lease lost, database down:
  BROKER_FAILURES, handled by the loop) is logged with its traceback and fails only that
  attempt: killed, FAILED with cause "broker_error", the error in its events. A second
  failure ends it at once; a third quarantines it (skipped, holding its GPUs, until the
  broker restarts), so no row can stop the broker.
- `_start_or_fail`: a rank that cannot start (StartFailed: a working directory that
  vanished, a NUL byte in its command) fails its attempt with its cause
  (`start_failed:<kind>`, providers.start_errors); `_retry_start` decides whether the job
  goes back to the queue (another node may do) or fails (the job's fault, or too many tries).
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
from broker.control.snapshots import failed_start_nodes, pending_view, pool_views
from broker.errors import LeaseLost, NotLeader
from broker.policy.avoid import avoid_nodes
from broker.spec_broker import BrokerSettings
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, EndReason, Job, JobState
from providers import start_errors
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
    settings: BrokerSettings
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
                   job_id=job.id, attempt_id=a.id, error=str(e)[:500], cause=e.cause)
            a.state, a.stop_requested_at, a.stop_reason, a.cause = (
                AttemptState.STOPPING, now, "failed", e.cause[:64])
            s.add(a)
            s.commit()
            for h in a.handles:
                self.executor.signal(h, signal.SIGKILL)
            return False

    def _retry_start(self, s: Session, job: Job, a: Attempt, now: float) -> bool:
        """The verdict on an attempt that ended because a rank could not start (its cause
        `start_failed:<kind>`, providers.start_errors), recorded as an event naming the cause:
        True to requeue the job, False when it fails. It fails at once when only the job can be
        at fault (an exec format error of its own script, arguments too large), and once
        `max_start_failures` of its attempts failed to start; until then the policy places it
        elsewhere than the nodes it failed on (broker.policy.avoid)."""
        cause = a.cause or start_errors.PREFIX
        n = 1 + len(s.exec(select(Attempt.id).where(
            Attempt.job_id == job.id, Attempt.id != a.id, Attempt.state == AttemptState.ENDED,
            col(Attempt.cause).startswith(start_errors.PREFIX + ":"))).all())
        limit = self.settings.max_start_failures
        nodes = ", ".join(node for node, _ in a.alloc)
        why = f"attempt {a.number} could not start on {nodes}: {start_errors.describe(cause)} ({cause})"
        failed_on = failed_start_nodes(s, job.id).get(job.id or 0, frozenset()) | {nd for nd, _ in a.alloc}
        if start_errors.job_at_fault(cause):
            verdict, retry = "another node would fail the same way: the job fails", False
        elif not avoid_nodes(pending_view(job, failed_on=failed_on), pool_views(s, {})):
            verdict, retry = (f"start failure {n} of {limit}, and no other node could run it "
                              "(it failed on every one that could): the job fails"), False
        elif n >= limit:
            verdict, retry = f"start failure {n} of {limit} (broker.max_start_failures): the job fails", False
        else:
            verdict, retry = (f"start failure {n} of {limit}: back in the queue, to run on "
                              "another node where there is one"), True
        record(s, now, "start_retry" if retry else "start_failed_final", f"{why}; {verdict}",
               job_id=job.id, attempt_id=a.id, cause=cause, nodes=[nd for nd, _ in a.alloc],
               start_failures=n, max_start_failures=limit)
        return retry

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

"""The engine's side of retries (issue 29): a FAILED attempt of a job with retries left goes
back to the queue, to start no sooner than its backoff (broker.control.holds keeps it out of
the plan until then) and resume from its newest checkpoint. The rule is
broker.policy.retries.decide; this module reads the job and writes the outcome."""

from __future__ import annotations

from sqlmodel import Session

from broker.control.guards import BROKER_CAUSES
from broker.policy.retries import RetryRule, decide
from broker.runtime import EXIT_PREEMPTED
from broker.state.events import record
from broker.state.model import Attempt, Job, JobState
from providers import start_errors

BROKER_EXIT_CODES = (EXIT_PREEMPTED,)  # the runtime's exit after SIGTERM: the broker asked for it


def rule_of(job: Job) -> RetryRule:
    return RetryRule(job.retries, job.retry_backoff_s, frozenset(job.no_retry_exit_codes or ()))


def retry_failed(s: Session, job: Job, a: Attempt, now: float, code: int | None) -> bool:
    """Requeue `job` after its FAILED attempt `a` (exit `code`) if its retry rule says so:
    PENDING again, `not_before` its backoff, an event naming the cause and the retry. Returns
    whether it did; the caller commits."""
    if job.cancel_requested or job.retries <= 0:
        return False
    broker = a.cause in BROKER_CAUSES or start_errors.is_start_failure(a.cause)
    d = decide(rule_of(job), job.retried, code, broker_cause=broker,
               broker_exit_codes=BROKER_EXIT_CODES)
    if not d.retry:
        record(s, now, "not_retried", f"attempt {a.number} failed: {d.why}", job_id=job.id,
               attempt_id=a.id, exit_code=code)
        return False
    job.state, job.queued_at, job.not_before = JobState.PENDING, now, now + d.delay_s
    job.retried += 1
    since = (f"from its checkpoint at step {a.reached_step}" if a.reached_step is not None
             else "from the start: no checkpoint yet")
    record(s, now, "retrying", f"attempt {a.number} failed ({d.why}); back in the queue after "
           f"{d.delay_s:g}s, resuming {since}", job_id=job.id, attempt_id=a.id, exit_code=code,
           delay_s=d.delay_s, retry=job.retried, cause=a.cause)
    return True

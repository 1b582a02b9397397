"""Retries of a job's own failures (issue 29), as a pure rule.

A job with `retries: N` that fails by itself (an attempt ended FAILED with a non-zero exit
code of the job's own) goes back to the queue up to N times, each time after a backoff that
doubles (`backoff_s`, 2x, 4x, ... at most MAX_BACKOFF_S), and resumes from its newest
checkpoint like any requeued job. Never retried:

- exit codes listed in the job's `no_retry_exit_codes` (a bad argument, a known-fatal error);
- failures that are the broker's, not the job's: a rank that could not start, an error of the
  broker while handling the attempt (the caller says so with `broker_cause`), and the exit
  codes the broker's own runtime uses (`broker_exit_codes`, e.g. the exit after SIGTERM);
- an attempt that ended without an exit code.

Losses that are not failures (preemption, node lost, interruption, rebalancing) are not
decided here: they requeue as always and do not count.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

MAX_BACKOFF_S = 3600.0


@dataclass(frozen=True, slots=True)
class RetryRule:
    """A job's retry settings: how many retries, the first backoff, the exit codes never retried."""

    retries: int = 0
    backoff_s: float = 30.0
    no_retry_exit_codes: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Retry or not; `delay_s` before the next try may start; `why` says which rule decided."""

    retry: bool
    why: str
    delay_s: float = 0.0


def decide(rule: RetryRule, retried: int, exit_code: int | None, *, broker_cause: bool = False,
           broker_exit_codes: Collection[int] = ()) -> RetryDecision:
    """Whether a FAILED attempt of a job that already retried `retried` times is retried."""
    if broker_cause:
        return RetryDecision(False, "a failure of the broker, not of the job (not retried here)")
    if not exit_code:
        return RetryDecision(False, "ended without an exit code of the job's own")
    if exit_code in broker_exit_codes:
        return RetryDecision(False, f"exit code {exit_code} is the broker runtime's own")
    if exit_code in rule.no_retry_exit_codes:
        return RetryDecision(False, f"exit code {exit_code} is in no_retry_exit_codes")
    if retried >= rule.retries:
        return RetryDecision(False, f"no retries left ({retried} of {rule.retries} used)"
                             if rule.retries else "retries: 0")
    delay = min(MAX_BACKOFF_S, rule.backoff_s * 2.0 ** retried)
    return RetryDecision(True, f"exit code {exit_code}: retry {retried + 1} of {rule.retries}", delay)

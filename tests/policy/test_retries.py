"""Retry classification (issue 29): which failures of a job are retried, and after how long."""

from __future__ import annotations

import pytest

from broker.policy.retries import MAX_BACKOFF_S, RetryRule, decide

RULE = RetryRule(retries=3, backoff_s=10.0, no_retry_exit_codes=frozenset({2}))


@pytest.mark.parametrize(("retried", "code", "kw", "retry", "delay", "why"), [
    (0, 1, {}, True, 10.0, "exit code 1: retry 1 of 3"),
    (1, 1, {}, True, 20.0, "retry 2 of 3"),
    (2, 137, {}, True, 40.0, "retry 3 of 3"),
    (3, 1, {}, False, 0.0, "no retries left (3 of 3 used)"),
    (0, 2, {}, False, 0.0, "exit code 2 is in no_retry_exit_codes"),
    (0, 143, {"broker_exit_codes": (143,)}, False, 0.0, "broker runtime's own"),
    (0, 1, {"broker_cause": True}, False, 0.0, "a failure of the broker"),
    (0, None, {}, False, 0.0, "without an exit code"),
    (0, 0, {}, False, 0.0, "without an exit code"),
])
def test_retry_classification(retried, code, kw, retry, delay, why):
    d = decide(RULE, retried, code, **kw)
    assert (d.retry, d.delay_s) == (retry, delay) and why in d.why


def test_backoff_is_capped():
    d = decide(RetryRule(retries=50, backoff_s=60.0), 20, 1)
    assert d.retry and d.delay_s == MAX_BACKOFF_S


def test_no_retries_by_default():
    assert decide(RetryRule(), 0, 1).why == "retries: 0"

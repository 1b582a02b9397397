"""Dependencies as pure rules (issue 29): the `after:` forms, and whether a job's dependencies
are met, pending, or can never be met."""

from __future__ import annotations

import pytest

from broker.policy.dependencies import AfterRef, resolve
from broker.policy.dependencies import parse_after as parse


@pytest.mark.parametrize(("text", "want"), [
    ("12", AfterRef(12, "job", "ok")),
    ("12:ok", AfterRef(12, "job", "ok")),
    ("12:any", AfterRef(12, "job", "any")),
    ("12:failed", AfterRef(12, "job", "failed")),
    ("7[*]:any", AfterRef(7, "all", "any")),
    ("7[i]", AfterRef(7, "same", "ok")),
])
def test_after_forms(text, want):
    assert parse(text) == want


@pytest.mark.parametrize(("text", "says"), [
    ("x", "must be JOB, JOB:ok"),
    ("12:done", "condition must be one of ok, any, failed (got 'done'"),
    ("0", "job ids start at 1"),
    ("7[3]", "must be JOB"),
])
def test_bad_after_forms(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse(text)


@pytest.mark.parametrize(("after", "states", "met", "waiting", "never"), [
    ([], {}, True, "", ""),
    ([(1, "ok")], {1: "SUCCEEDED"}, True, "", ""),
    ([(1, "ok")], {1: "RUNNING"}, False, "waiting for job 1 to succeed", ""),
    ([(1, "ok")], {1: "FAILED"}, False, "", "job 1 ended FAILED; this job needed it to succeed"),
    ([(1, "ok")], {1: "CANCELLED"}, False, "", "ended CANCELLED"),
    ([(1, "any")], {1: "CANCELLED"}, True, "", ""),
    ([(1, "any")], {1: "PENDING"}, False, "waiting for job 1 to end", ""),
    ([(1, "failed")], {1: "BUDGET_EXHAUSTED"}, True, "", ""),
    ([(1, "failed")], {1: "SUCCEEDED"}, False, "", "job 1 ended SUCCEEDED; this job needed it to fail"),
    ([(1, "ok")], {}, False, "", "job 1 does not exist"),
    # several: the first unmeetable one wins over waiting; waits are counted
    ([(1, "ok"), (2, "ok"), (3, "ok")], {1: "PENDING", 2: "RUNNING", 3: "SUCCEEDED"}, False,
     "waiting for job 1 to succeed (and 1 more)", ""),
    ([(1, "ok"), (2, "ok")], {1: "PENDING", 2: "FAILED"}, False, "", "job 2 ended FAILED"),
])
def test_resolve(after, states, met, waiting, never):
    st = resolve(after, states)
    assert st.met == met and st.waiting == waiting and never in st.never and bool(st.never) == bool(never)

"""Retries end to end (issue 29): the spec's checks, and an engine with real processes that
retries a job's own failure after its backoff, resuming from its checkpoint, and does not
retry an exit code the job lists as fatal."""

from __future__ import annotations

import sys

import pytest

from broker.errors import SpecError
from broker.spec import parse_job
from tests.conftest import drive

BASE = {"name": "r", "team": "research", "command": ["true"]}


@pytest.mark.parametrize(("extra", "says"), [
    ({"retries": -1}, "retries: Input should be greater than or equal to 0"),
    ({"retries": 101}, "retries: Input should be less than or equal to 100"),
    ({"no_retry_exit_codes": [0]}, "no_retry_exit_codes: exit codes are 1 to 255 (got 0)"),
    ({"retry_backoff_s": -5}, "retry_backoff_s: Input should be greater than or equal to 0"),
])
def test_bad_retry_settings_name_the_field(extra, says):
    with pytest.raises(SpecError) as e:
        parse_job({**BASE, **extra})
    assert says in str(e.value)


# Saves a checkpoint at step 0, then fails on attempt 1 with the exit code given; on a resume
# it prints what it resumed from and succeeds.
FLAKY = """
import os, sys
from broker import runtime
ck = runtime.restore()
if ck is not None:
    print("resumed from", ck.step, flush=True)
    runtime.done()
    sys.exit(0)
runtime.save(0, files={"x": b"x"})
runtime.wait()
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize(("code", "attempts", "final"), [
    (3, ["FAILED", "COMPLETED"], "SUCCEEDED"),  # its own failure: retried, resumes at step 0
    (2, ["FAILED"], "FAILED"),  # listed in no_retry_exit_codes: ends at once
])
def test_job_failure_is_retried_after_backoff_from_its_checkpoint(make_cluster, clock, tmp_path,
                                                                  code, attempts, final):
    c, eng = make_cluster()
    jid = c.submit(name="flaky", team="research", command=[sys.executable, "-c", FLAKY, str(code)],
                   retries=2, retry_backoff_s=50, no_retry_exit_codes=[2], workdir=str(tmp_path)).id
    drive(eng, lambda: c.get(jid).attempt_list and c.get(jid).attempt_list[0].state == "ENDED")
    info = c.get(jid)
    kinds = [e.kind for e in c.events(jid)]
    if final == "FAILED":
        assert info.status == "FAILED" and "not_retried" in kinds
        assert [a.end_reason for a in info.attempt_list] == attempts
        return
    assert info.status == "PENDING" and "retrying" in kinds
    for _ in range(3):  # the backoff holds it: the clock has not moved
        eng.cycle()
    info = c.get(jid)
    assert info.status == "PENDING" and len(info.attempt_list) == 1
    assert "retry 1 of 2 after a failure" in (info.waiting_reason or "")
    clock.advance(50)
    drive(eng, lambda: c.get(jid).status in ("SUCCEEDED", "FAILED"))
    info = c.get(jid)
    assert info.status == final and [a.end_reason for a in info.attempt_list] == attempts
    assert (info.retries, info.retried) == (2, 1)
    assert info.attempt_list[0].exit_code == code and info.attempt_list[1].restored_step == 0
    ev = next(e for e in c.events(jid) if e.kind == "retrying")
    assert f"exit code {code}: retry 1 of 2" in ev.message and ev.data["delay_s"] == 50

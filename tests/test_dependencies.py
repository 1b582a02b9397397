"""Dependencies end to end (issue 29): a submit naming jobs that do not exist is refused (so no
cycle can form), and an engine with real processes starts each job only once what it waits
for happened, and ends the jobs whose dependency can never be met."""

from __future__ import annotations

import sys

import pytest

from broker.errors import SpecError
from tests.conftest import drive

EXIT = "import sys; sys.exit(int(sys.argv[1]))"


def run(code: int) -> list[str]:
    return [sys.executable, "-c", EXIT, str(code)]


@pytest.mark.parametrize(("fields", "says"), [
    ({"after": ["99"]}, "after: no job with id 99"),
    ({"after": ["99[*]"]}, "after: no array with id 99"),
    ({"after": ["1[i]"]}, "after: ARRAY[i] (same index) needs this submit to be an array"),
    ({"after": ["2[i]"], "array": "0-5"}, "after: array 2 has no element with index 2"),
    ({"after": ["1:maybe"]}, "condition must be one of ok, any, failed"),
    ({"after": ["2[*]"]}, "after: names 2 jobs; at most 1"),
])
def test_submits_naming_what_does_not_exist_are_refused(make_cluster, monkeypatch, fields, says):
    monkeypatch.setattr("broker.client.submit_deps.MAX_DEPS", 1)
    c, _ = make_cluster()
    c.submit(name="a", team="research", command=run(0))  # job 1
    c.submit(name="arr", team="research", command=run(0), array="0-1")  # array 2: jobs 2, 3
    with pytest.raises(SpecError) as e:
        c.submit(name="b", team="research", command=run(0), **fields)
    assert says in str(e.value)
    assert len(c.list()) == 3  # nothing written


def test_jobs_start_after_what_they_wait_for(make_cluster, tmp_path):
    c, eng = make_cluster(pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 1}])
    kw = {"team": "research", "workdir": str(tmp_path)}
    ok = c.submit(name="ok", command=run(0), **kw).id
    bad = c.submit(name="bad", command=run(1), **kw).id
    after_ok = c.submit(name="after-ok", command=run(0), after=[f"{ok}:ok"], **kw).id
    after_bad_ok = c.submit(name="needs-bad-ok", command=run(0), after=[str(bad)], **kw).id
    chained = c.submit(name="chained", command=run(0), after=[f"{after_bad_ok}:ok"], **kw).id
    on_fail = c.submit(name="on-fail", command=run(0), after=[f"{bad}:failed", f"{ok}:any"], **kw).id
    xs = c.submit(name="xs", command=run(0), array="0-1", **kw)
    ys = c.submit(name="ys", command=run(0), array="0-1", after=[f"{xs.id}[i]:ok"], **kw)
    assert c.get(ys.id).after == [[xs.id, "ok"]] and c.get(ys.id + 1).after == [[xs.id + 1, "ok"]]
    eng.cycle()
    assert c.get(after_ok).status == "PENDING" and c.get(ys.id).status == "PENDING"
    assert c.get(after_ok).waiting_reason == f"waiting for job {ok} to succeed"
    assert c.get(ys.id).waiting_reason == f"waiting for job {xs.id} to succeed"
    final = ("SUCCEEDED", "FAILED")
    drive(eng, lambda: all(c.get(j).status in final for j in range(ok, ys.id + 2)), advance=1.0)
    status = {j: c.get(j).status for j in range(ok, ys.id + 2)}
    assert status == {ok: "SUCCEEDED", bad: "FAILED", after_ok: "SUCCEEDED", after_bad_ok: "FAILED",
                      chained: "FAILED", on_fail: "SUCCEEDED", xs.id: "SUCCEEDED", xs.id + 1: "SUCCEEDED",
                      ys.id: "SUCCEEDED", ys.id + 1: "SUCCEEDED"}
    assert c.get(after_bad_ok).attempt_list == [] and c.get(chained).attempt_list == []
    never = next(e for e in c.events(after_bad_ok) if e.kind == "dependency_never_met")
    assert f"job {bad} ended FAILED; this job needed it to succeed" in never.message
    assert any(e.kind == "dependency_never_met" and f"job {after_bad_ok} ended FAILED" in e.message
               for e in c.events(chained))
    for first, then in ((ok, after_ok), (xs.id, ys.id), (xs.id + 1, ys.id + 1), (bad, on_fail)):
        assert c.get(then).attempt_list[0].started_at >= c.get(first).attempt_list[0].ended_at

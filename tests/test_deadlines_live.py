"""Deadlines in the live broker (issue 31): the spec, what broker.control.deadlines reads from real
rows, and one engine run with real processes on an injected clock: cheap capacity while the job
keeps pace, moved to capacity that will not be taken in time to finish."""

from __future__ import annotations

from typing import Any

import pytest

from broker.control import deadlines
from broker.control.snapshots import pending_view
from broker.errors import SpecError
from broker.spec import SpotPolicy, parse_job
from broker.state.model import Attempt, AttemptState, Job
from tests.conftest import drive, train

# Two local pools of the same shape, billed as spot (cheap) and on demand (dear).
POOLS = [{"name": "spot", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "market": "spot",
          "price_per_node_hour": 8.0},
         {"name": "od", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "market": "on_demand",
          "price_per_node_hour": 32.0}]
JOB = {"name": "j", "team": "research", "command": ["x"]}


@pytest.mark.parametrize(("given", "at"), [
    ("2026-12-06T18:00:00Z", 1796580000.0), ("2026-12-06 19:00+01:00", 1796580000.0),
    ("36h", 1000.0 + 36 * 3600), ("1d12h", 1000.0 + 36 * 3600), ("90m", 1000.0 + 5400), (None, None),
])
def test_deadline_forms(given: str | None, at: float | None) -> None:
    js = parse_job({**JOB, **({} if given is None else {"deadline": given})})
    assert js.deadline_at(1000.0) == at


@pytest.mark.parametrize(("given", "mentions"), [
    ("tomorrow", "ISO 8601 time with its zone"), ("2026-12-06T18:00:00", "ISO 8601 time with its zone"),
    ("2026-02-30T00:00Z", "not a valid date"), ("0h", "more than 0 s"), ("", "ISO 8601"),
    ("x" * 200, "at most 100 characters"),
])
def test_bad_deadlines_name_the_field_and_the_forms(given: str, mentions: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job({**JOB, "deadline": given})
    (line,) = [p for p in e.value.problems if p.startswith("deadline:")]
    assert mentions in line and not line.startswith("deadline: deadline")


def test_a_deadline_already_past_is_refused_at_submit(make_cluster) -> None:
    c, _ = make_cluster()
    with pytest.raises(SpecError, match="deadline: '1970-01-02T00:00Z' is already past"):
        c.submit(name="late", team="research", command=train(2), deadline="1970-01-02T00:00Z")  # 86,400 s
    assert c.list() == []


def att(number: int, state: str = AttemptState.ENDED, **kw: Any) -> Attempt:
    return Attempt(job_id=1, number=number, pool="spot", priority="normal", state=state, **kw)


FACTS = [
    # name, job fields, attempts, now, expected fields of DeadlineFacts
    ("pending, never ran: nothing measured", {}, [], 500.0,
     dict(progress=None, worked_s=0.0, restart_s=deadlines.DEFAULT_RESTART_S, margin_s=0.0)),
    ("kept work: first step to last checkpoint, and the running one up to now", {},
     [att(1, started_at=0, first_step_at=10, last_checkpoint_at=110, restart_overhead_s=10),
      att(2, AttemptState.RUNNING, started_at=200, first_step_at=230, last_checkpoint_at=260,
          restart_overhead_s=30, progress_step=50, progress_total=100, progress_rate=2.0)], 300.0,
     dict(progress=(50, 100, 2.0), worked_s=100.0 + 70.0, restart_s=20.0, margin_s=40.0)),
    ("a report without a rate is no progress", {"expected_duration_s": 900.0},
     [att(1, AttemptState.RUNNING, started_at=0, progress_step=5, progress_total=100)], 60.0,
     dict(progress=None, expected_s=900.0, worked_s=60.0)),
    ("a resumed attempt not yet rated: its restored step at the rate measured before", {},
     [att(1, started_at=0, progress_step=80, progress_total=100, progress_rate=4.0),
      att(2, AttemptState.RUNNING, started_at=100, restored_step=70)], 120.0,
     dict(progress=(70, 100, 4.0))),
    ("told safe before: on_safe", {"deadline_where": "late"}, [], 0.0, dict(on_safe=True)),
]


@pytest.mark.parametrize(("name", "jobkw", "atts", "now", "expect"), FACTS, ids=[f[0] for f in FACTS])
def test_facts(name: str, jobkw: dict, atts: list, now: float, expect: dict) -> None:
    j = Job(id=1, name="j", team="t", command=["x"], submit_time=0.0, queued_at=0.0, deadline=5000.0, **jobkw)
    f = deadlines.facts(j, atts, now)
    assert {k: getattr(f, k) for k in expect} == pytest.approx(expect), name
    assert (f.start, f.deadline, f.now) == (0.0, 5000.0, now)


@pytest.mark.parametrize(("where", "own", "seen"), [
    (None, "allowed", SpotPolicy.ALLOWED), ("cheap", "allowed", SpotPolicy.ONLY),
    ("cheap", "never", SpotPolicy.NEVER), ("safe", "only", SpotPolicy.NEVER),
    ("late", "allowed", SpotPolicy.NEVER)])
def test_the_plan_sees_spot_only_on_pace_and_no_spot_when_it_must_run_safe(
        where: str | None, own: str, seen: SpotPolicy) -> None:
    j = Job(id=1, name="j", team="t", command=["x"], submit_time=0.0, queued_at=0.0, spot=own,
            deadline=10.0, deadline_where=where)
    assert pending_view(j).spot is seen


def test_cheap_while_on_pace_then_moved_off_spot_in_time(make_cluster, clock, monkeypatch) -> None:
    monkeypatch.setenv("ONEPOOL_PROGRESS_EVERY_S", "0.1")  # inherited by the job: its rate soon
    c, eng = make_cluster(pools=POOLS)
    # 1,500 steps of 20 ms (about 30 s of work, its estimate 60 s), due in an hour: far ahead of its pace
    j = c.submit(name="due", team="research", command=train(1500, step_s=0.02, ckpt_every=100),
                 gpus_per_node=2, deadline="1h", expected_duration_s=60).id
    drive(eng, lambda: c.get(j).status == "RUNNING" and c.get(j).attempt_list[0].progress_step is not None)
    info = c.get(j)
    assert info.deadline_where == "cheap" and info.attempt_list[0].pool == "spot"
    # 58 min later on the broker's clock (a few seconds of the job's) it is far behind the pace
    # and a stop would cost the work since its last checkpoint: it must run safe, and moves
    clock.advance(3600 - 120)
    drive(eng, lambda: len(c.get(j).attempt_list) == 2 and c.get(j).status == "RUNNING", timeout=60)
    info = c.get(j)
    assert info.deadline_where == "safe"
    assert [a.pool for a in info.attempt_list] == ["spot", "od"]
    assert info.attempt_list[0].end_reason == "REBALANCED" and info.attempt_list[1].restored_step is not None
    ev = [(e.kind, e.data.get("where")) for e in c.events(j) if e.kind.startswith("deadline")]
    assert ev == [("deadline", "cheap"), ("deadline", "safe"), ("deadline_move", None)]
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")


def test_safe_until_its_progress_is_measured_then_back_to_spot(make_cluster, clock, monkeypatch) -> None:
    monkeypatch.setenv("ONEPOOL_PROGRESS_EVERY_S", "0.1")
    c, eng = make_cluster(pools=POOLS)
    # no estimate: nothing shows it keeps pace, so it starts on demand; once it reports progress
    # (far ahead: 1,500 steps of 20 ms for an hour) it moves to spot at its checkpoint on SIGTERM
    j = c.submit(name="due", team="research", command=train(1500, step_s=0.02, ckpt_every=100),
                 gpus_per_node=2, deadline="1h").id
    drive(eng, lambda: len(c.get(j).attempt_list) == 2 and c.get(j).status == "RUNNING", timeout=60)
    info = c.get(j)
    assert [a.pool for a in info.attempt_list] == ["od", "spot"] and info.deadline_where == "cheap"
    assert info.attempt_list[0].end_reason == "REBALANCED"
    ev = [(e.kind, e.data.get("where") or e.data.get("to")) for e in c.events(j)
          if e.kind.startswith("deadline")]
    assert ev == [("deadline", "safe"), ("deadline", "cheap"), ("deadline_move", "cheap")]
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")


def test_the_cli_submits_auto_and_a_deadline_and_status_shows_both(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from broker.client.sdk import Client
    from broker.policy.intervals import Advice
    from tests.test_cli import CONFIG, cli, cli_json, flat, stored_job

    (tmp_path / "onepool.yaml").write_text(yaml.safe_dump(CONFIG))
    home = tmp_path / "home"
    cli(home, "apply", "-c", str(tmp_path / "onepool.yaml"))

    info = cli_json(home, "submit", "--name", "due", "--team", "research", "--checkpoint-interval-s",
                    "auto", "--deadline", "2026-12-06T18:00:00Z", "--", "python", "train.py")
    job = stored_job(home, info["id"])
    assert (job.checkpoint_auto, job.checkpoint_interval_s, job.deadline) == (True, 1800.0, 1796580000.0)
    shown = flat(cli(home, "status", str(info["id"])).stdout)
    assert "deadline: 2026-12-06 18:00:00 UTC; runs not decided yet" in shown
    assert "checkpoint interval" not in shown  # nothing advised before its first start
    c = Client(home)
    try:
        with c.store.session() as s:
            j = s.get(Job, info["id"])
            assert j is not None
            j.checkpoint_advice = Advice(600.0, 10.0, 0.5, "measured").to_record(0.0)
            j.checkpoint_interval_s = 600.0
            s.add(j)
            s.commit()
    finally:
        c.store.dispose()
    out = flat(cli(home, "status", str(info["id"])).stdout)
    assert "checkpoint interval: 600 s (auto: the advised one); advised 600 s" in out
    assert "at 600 s, 60 s saving + 150 s lost" in out

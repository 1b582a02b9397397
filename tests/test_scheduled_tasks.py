"""The leader's periodic tasks on APScheduler (broker.control.scheduled): the schedule lives in
the broker's database (SQLite and PostgreSQL), only the lease holder schedules, tasks run on
the loop's thread, and a failing task is logged and runs again at its next time."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import select

from broker.clock import FakeClock
from broker.control import scheduled, service
from broker.control.config_apply import applied_config
from broker.control.lease import Lease
from broker.control.scheduled import TaskScheduler
from broker.control.snapshots import team_views
from broker.errors import NotLeader
from broker.spec import BrokerSettings, TaskIntervals
from broker.state.model import Attempt, AttemptState, Job, JobState, Node, NodeState, SchedulerJob
from tests.test_cloud_engine import ONPREM, nodes, spot_pool

pytestmark = pytest.mark.both_dbs


def stored(store) -> dict[str, float | None]:  # type: ignore[no-untyped-def]
    with store.session() as s:
        return {r.id: r.next_run_time for r in s.exec(select(SchedulerJob))}


def test_the_schedule_is_stored_in_the_database_and_a_new_leader_continues_it(make_cluster):
    c, _ = make_cluster()
    settings = BrokerSettings(tasks=TaskIntervals(refresh_prices_s=900, rebalance_s=300))
    first = TaskScheduler(c.store, settings)
    first.start()
    runs = first.next_runs()
    first.shutdown()
    assert set(stored(c.store)) == set(scheduled.TASKS)
    assert runs["rebalance"] - datetime.now(UTC) < timedelta(seconds=301)
    second = TaskScheduler(c.store, settings)  # the next leader: same intervals, same next runs
    second.start()
    assert second.next_runs() == runs
    second.shutdown()
    third = TaskScheduler(c.store, BrokerSettings(tasks=TaskIntervals(refresh_prices_s=60)))  # changed
    third.start()
    assert third.next_runs()["refresh_prices"] < runs["refresh_prices"]
    assert third.next_runs()["rebalance"] == runs["rebalance"]
    third.shutdown()


def test_due_tasks_run_on_the_loop_and_a_failure_is_logged_and_retried(make_cluster, monkeypatch, caplog):
    c, eng = make_cluster()
    calls: list[tuple[str, float]] = []

    def boom(engine, now):  # type: ignore[no-untyped-def]
        calls.append(("refresh_prices", now))
        raise RuntimeError("the price API is down")

    monkeypatch.setattr(scheduled, "TASKS", {
        "refresh_prices": (lambda b: b.tasks.refresh_prices_s, boom),
        "rebalance": (lambda b: b.tasks.rebalance_s, lambda e, now: calls.append(("rebalance", now)))})
    woken = threading.Event()
    tasks = TaskScheduler(c.store, eng.settings, woken.set)
    tasks.start()
    try:
        assert tasks.run_due(eng) == []  # nothing is due yet
        for name in ("refresh_prices", "rebalance"):  # both come due now
            tasks.scheduler.modify_job(name, next_run_time=datetime.now(UTC))
        with caplog.at_level(logging.ERROR, logger="onepool.tasks"):
            ran = due_soon(tasks, woken, eng, 2)
        assert sorted(ran) == ["rebalance", "refresh_prices"]
        assert sorted(calls) == [("rebalance", eng.clock.now()), ("refresh_prices", eng.clock.now())]
        assert "task refresh_prices failed; it runs again at its next time" in caplog.text
        nxt = tasks.next_runs()["refresh_prices"]  # still scheduled, at its next interval
        soon = datetime.now(UTC) + timedelta(seconds=eng.settings.tasks.refresh_prices_s - 60)
        assert nxt is not None and nxt > soon
        tasks.scheduler.modify_job("refresh_prices", next_run_time=datetime.now(UTC))
        assert due_soon(tasks, woken, eng) == ["refresh_prices"]  # it runs again
        assert [n for n, _ in calls].count("refresh_prices") == 2
    finally:
        tasks.shutdown()


def due_soon(tasks: TaskScheduler, woken: threading.Event, eng, n: int = 1) -> list[str]:  # type: ignore[no-untyped-def]
    """Run tasks as the loop does, each time it is woken, until `n` that just came due ran."""
    ran: list[str] = []
    deadline = time.monotonic() + 10
    while len(ran) < n:
        assert woken.wait(max(0.0, deadline - time.monotonic())), "the loop was not woken for due tasks"
        woken.clear()
        ran += tasks.run_due(eng)
    return ran


DUTIES = ("scale_down", "sweep_orphans", "enforce_budgets", "decay_fair_share", "retain_checkpoints")


def spy(monkeypatch, eng) -> list[str]:  # type: ignore[no-untyped-def]
    """Record every call of the engine's duty methods (each still runs)."""
    calls: list[str] = []
    for name in DUTIES:
        real = getattr(eng, name)
        monkeypatch.setattr(eng, name, lambda now, n=name, r=real: (calls.append(n), r(now))[1])
    return calls


def test_every_duty_is_a_task_whose_interval_comes_from_the_config(make_cluster):
    c, _ = make_cluster(tasks={"scale_down_s": 7, "retain_checkpoints_s": 1800}, orphan_sweep_s=45)
    with c.store.session() as s:
        settings = applied_config(s).broker
    tasks = TaskScheduler(c.store, settings)
    tasks.start()
    try:
        every = {j.id: j.trigger.interval.total_seconds() for j in tasks.scheduler.get_jobs()}
    finally:
        tasks.shutdown()
    assert every == {"refresh_prices": 900, "rebalance": 300, "scale_down": 7, "sweep_orphans": 45,
                     "enforce_budgets": 30, "decay_fair_share": 300, "retain_checkpoints": 1800}


@pytest.mark.parametrize(("attached", "in_cycle"), [
    (False, ["enforce_budgets", "retain_checkpoints", "decay_fair_share"]),  # as always
    (True, []),  # the schedule drives them
])
def test_with_a_schedule_attached_the_cycle_leaves_the_duties_to_it(make_cluster, monkeypatch,
                                                                     attached, in_cycle):
    c, eng = make_cluster()
    calls = spy(monkeypatch, eng)
    woken = threading.Event()
    tasks = TaskScheduler(c.store, eng.settings, woken.set)
    tasks.start()
    try:
        if attached:
            tasks.attach(eng)
        assert eng.duties_scheduled is attached
        eng.cycle()
        assert calls == in_cycle
        calls.clear()
        for name in scheduled.TASKS:
            tasks.scheduler.modify_job(name, next_run_time=datetime.now(UTC))
        ran = due_soon(tasks, woken, eng, len(scheduled.TASKS))
        assert sorted(ran) == sorted(scheduled.TASKS)
        assert sorted(calls) == sorted(DUTIES)  # each task runs its duty once
    finally:
        tasks.shutdown()
    assert eng.duties_scheduled is False  # shut down: the cycle runs them again
    calls.clear()
    eng.cycle()
    assert calls == ["enforce_budgets", "retain_checkpoints", "decay_fair_share"]


@pytest.mark.parametrize("driver", ["cycle", "task"])
def test_an_idle_rented_node_is_given_back_after_its_timeout_and_not_before(make_cluster, clock,
                                                                              monkeypatch, driver):
    """Unscheduled, the cycle gives an idle rented node back once its pool's idle_timeout_s
    has passed; with the duties scheduled the cycle keeps it, and the scale_down task gives
    it back, by the same rule. (The decision only: the pool's cloud worker, which terminates
    the instance, does not run; tests/test_rebalance_cloud.py runs the whole way in moto.)"""
    c, eng = make_cluster(pools=[ONPREM, spot_pool(idle_timeout_s=600)], server_url="http://127.0.0.1:9")
    monkeypatch.setattr(eng.capacity, "_run_workers", lambda: None)  # no cloud calls at all
    eng.duties_scheduled = driver == "task"
    with c.store.session() as s:
        s.add(Node(id="spot-idle", pool="spot", gpus=4, state=NodeState.UP, token="t",
                   launched_at=clock.now()))
        s.commit()
    eng.cycle()  # seen idle from now
    assert nodes(c)[0].idle_since == clock.now()

    def state_after(seconds: float) -> tuple[str, str | None]:
        clock.advance(seconds)
        eng.cycle()
        if driver == "task":
            eng.scale_down(clock.now())
        n = nodes(c)[0]
        return n.state, n.end_reason

    assert state_after(599) == ("up", None)  # one second short of the timeout: kept
    if driver == "task":
        clock.advance(1)
        eng.cycle()
        assert nodes(c)[0].state == "up"  # the cycle leaves it to the task
        assert eng.scale_down(clock.now()) == ["spot-idle"]
    else:
        assert state_after(1)[1] == "idle"
    assert nodes(c)[0].end_reason == "idle"
    idle_since = nodes(c)[0].idle_since
    assert [e.time - idle_since for e in c.events() if e.kind == "node_releasing"] == [600]


def test_fair_share_usage_is_carried_forward_between_decays(make_cluster, clock):
    """Between two runs of decay_fair_share the snapshot carries each team's usage forward at
    the GPUs it holds now: exactly what computing it afresh gives while nothing changed."""
    c, eng = make_cluster()
    t0 = clock.now()
    with c.store.session() as s:
        for team, start, end, gpus in [("research", t0 - 7200, None, 2), ("prod", t0 - 86400, t0 - 3600, 1)]:
            j = Job(name=f"{team}-job", team=team, command=["true"], submit_time=start, queued_at=start,
                    state=JobState.RUNNING if end is None else JobState.SUCCEEDED, end_time=end)
            s.add(j)
            s.flush()
            s.add(Attempt(job_id=j.id, number=1, pool="a100", alloc=[["a100-0", list(range(gpus))]],
                          priority=1, started_at=start, gpus=gpus, ended_at=end,
                          state=AttemptState.RUNNING if end is None else AttemptState.ENDED))
        s.commit()
    eng.duties_scheduled = True
    eng.decay_fair_share(t0)
    clock.advance(250)
    with c.store.session() as s:
        carried = {t.name: t.usage for t in eng.snapshot(s, clock.now()).teams}
        fresh = {t.name: t.usage for t in team_views(s, clock.now(), eng.settings.fair_share_half_life_s)}
    assert carried == pytest.approx(fresh, rel=1e-9)
    assert carried["research"] > 2 * 7200 and 0 < carried["prod"] < 23 * 3600


def test_only_the_lease_holder_schedules(make_cluster):
    c, _ = make_cluster()  # its engine holds the lease: another broker only stands by
    with pytest.raises(NotLeader):
        service.run(c.store, FakeClock(), max_cycles=1)
    assert stored(c.store) == {}


def test_the_leader_loop_keeps_the_schedule(tmp_path):
    from broker.client.sdk import Client
    from broker.spec import parse_config
    from tests.conftest import config

    clock = FakeClock()
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config()))
    assert service.run(c.store, clock, max_cycles=1) == 1
    assert set(stored(c.store)) == set(scheduled.TASKS)
    lease = Lease(c.store, clock, 15.0)
    assert lease.try_acquire()  # the loop gave the lease back when it stopped
    lease.release()

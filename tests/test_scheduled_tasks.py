"""The leader's periodic tasks on APScheduler (broker.control.scheduled): the schedule lives in
the broker's database (SQLite and PostgreSQL), only the lease holder schedules, tasks run on
the loop's thread, and a failing task is logged and runs again at its next time."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import select

from broker.clock import FakeClock
from broker.control import scheduled, service
from broker.control.lease import Lease
from broker.control.scheduled import TaskScheduler
from broker.errors import NotLeader
from broker.spec import BrokerSettings, RebalanceSettings
from broker.state.model import SchedulerJob

pytestmark = pytest.mark.both_dbs


def stored(store) -> dict[str, float | None]:  # type: ignore[no-untyped-def]
    with store.session() as s:
        return {r.id: r.next_run_time for r in s.exec(select(SchedulerJob))}


def test_the_schedule_is_stored_in_the_database_and_a_new_leader_continues_it(make_cluster):
    c, _ = make_cluster()
    settings = BrokerSettings(price_refresh_s=900, rebalance=RebalanceSettings(interval_s=300))
    first = TaskScheduler(c.store, settings)
    first.start()
    runs = first.next_runs()
    first.shutdown()
    assert set(stored(c.store)) == {"refresh_prices", "rebalance"}
    assert runs["rebalance"] - datetime.now(UTC) < timedelta(seconds=301)
    second = TaskScheduler(c.store, settings)  # the next leader: same intervals, same next runs
    second.start()
    assert second.next_runs() == runs
    second.shutdown()
    third = TaskScheduler(c.store, BrokerSettings(price_refresh_s=60))  # a changed interval
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

    monkeypatch.setitem(scheduled.TASKS, "refresh_prices", (lambda b: b.price_refresh_s, boom))
    monkeypatch.setitem(scheduled.TASKS, "rebalance", (lambda b: b.rebalance.interval_s,
                                                       lambda e, now: calls.append(("rebalance", now))))
    woken = threading.Event()
    tasks = TaskScheduler(c.store, eng.settings, woken.set)
    tasks.start()
    try:
        assert tasks.run_due(eng) == []  # nothing is due yet
        for name in ("refresh_prices", "rebalance"):  # both come due now
            tasks.scheduler.modify_job(name, next_run_time=datetime.now(UTC))
        assert woken.wait(10), "the loop was not woken for due tasks"
        ran: list[str] = []
        while len(ran) < 2:
            woken.wait(10)
            woken.clear()
            with caplog.at_level(logging.ERROR, logger="onepool.tasks"):
                ran += tasks.run_due(eng)
        assert sorted(ran) == ["rebalance", "refresh_prices"]
        assert sorted(calls) == [("rebalance", eng.clock.now()), ("refresh_prices", eng.clock.now())]
        assert "task refresh_prices failed; it runs again at its next time" in caplog.text
        nxt = tasks.next_runs()["refresh_prices"]  # still scheduled, at its next interval
        soon = datetime.now(UTC) + timedelta(seconds=eng.settings.price_refresh_s - 60)
        assert nxt is not None and nxt > soon
    finally:
        tasks.shutdown()


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
    assert set(stored(c.store)) == {"refresh_prices", "rebalance"}
    lease = Lease(c.store, clock, 15.0)
    assert lease.try_acquire()  # the loop gave the lease back when it stopped
    lease.release()

"""One leader: the lease, its fencing number, fenced writes, standby and takeover, health.

In-process tests drive time with a FakeClock; the two-process test kills a real broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from sqlmodel import select

from broker.client.sdk import Client
from broker.clock import FakeClock, SystemClock
from broker.control.engine import Engine
from broker.control.lease import Lease, lease_row
from broker.errors import LeaseLost, NotLeader
from broker.spec import parse_config
from broker.state.model import Attempt, Job
from tests.conftest import ROOT, config, drive, train
from tests.test_crash_restart import start_broker, wait_for

pytestmark = pytest.mark.both_dbs
LEASE_S = 15.0  # the default


def test_a_second_engine_is_refused_while_the_lease_holds_and_takes_over_after_it(make_cluster, clock):
    c, first = make_cluster()
    assert first.lease.fencing == 1
    with pytest.raises(NotLeader, match="holds the lease"):
        Engine(c.store, clock)
    clock.advance(LEASE_S - 1)
    with pytest.raises(NotLeader):
        Engine(c.store, clock)
    clock.advance(1.5)  # the first broker never renewed: its lease ran out
    second = Engine(c.store, clock)
    assert second.lease.fencing == 2
    assert lease_row(c.store).holder == second.lease.holder
    second.close()


def test_the_leader_renews_while_it_cycles_so_nobody_takes_over(make_cluster, clock):
    c, eng = make_cluster()
    for _ in range(10):  # 50 s of cycles, each renewing before lease_s / 3 has passed
        eng.cycle()
        clock.advance(5)
    with pytest.raises(NotLeader):
        Engine(c.store, clock)


def test_a_woken_stale_leader_cannot_write_or_signal(make_cluster, clock):
    """The leader decided to preempt, paused (SIGSTOP, a long GC) past its lease, a standby
    took over; when it wakes, its fenced writes are refused and nothing is signalled."""
    c, old = make_cluster(grace_s=30)
    low = c.submit(name="low", team="research", command=train(400), gpus_per_node=2, priority="low").id
    drive(old, lambda: c.get(low).status == "RUNNING")
    clock.advance(LEASE_S + 1)
    new = Engine(c.store, clock, old.executor)
    c.submit(name="urgent", team="prod", command=train(2), gpus_per_node=2, priority="urgent")
    old.lease.renewed_at = clock.now()  # it paused right after checking its lease
    with pytest.raises(LeaseLost, match="fencing number 2"):
        old.cycle()
    a = c.get(low).attempt_list[0]
    assert a.state == "RUNNING" and "preempting" not in [e.kind for e in c.events(low)]
    with c.store.session() as s:  # the process was never signalled: still running
        handle = s.get(Attempt, a.id).handles[0]  # type: ignore[union-attr]
    assert old.executor.status(handle).state == "running"
    with pytest.raises(LeaseLost), old.store.session() as s:  # any write, not only the cycle's
        job = s.get(Job, low)
        assert job is not None
        job.name = "hijacked"
        s.add(job)
    assert c.get(low).name == "low"
    rep = new.cycle()  # the new leader acts
    assert rep.preempted == [low]
    c.cancel(low)
    drive(new, lambda: c.get(low).status == "CANCELLED", advance=31)
    new.close()


def test_work_left_over_from_an_earlier_term_cannot_write_when_the_process_leads_again(make_cluster,
                                                                                        clock):
    c, eng = make_cluster()
    term1 = eng.store
    j = c.submit(name="x", team="research", command=["true"]).id
    clock.advance(LEASE_S + 1)
    Engine(c.store, clock).close()  # another broker led (term 2) and stopped
    assert eng.lease.try_acquire() and eng.lease.fencing == 3  # this process leads again
    with pytest.raises(LeaseLost, match="fencing number 1"), term1.session() as s:
        job = s.get(Job, j)
        assert job is not None
        job.name = "stale"
        s.add(job)
    with pytest.raises(LeaseLost):
        term1.ensure()
    assert c.get(j).name == "x"


def test_reads_and_idle_sessions_of_a_stale_leader_are_not_refused(make_cluster, clock):
    c, old = make_cluster()
    clock.advance(LEASE_S + 1)
    new = Engine(c.store, clock)
    with old.store.session() as s:  # reading is harmless: no fence check, no error
        assert s.exec(select(Job)).all() == []
    new.close()


def test_racing_standbys_get_exactly_one_lease(make_cluster, clock):
    c, first = make_cluster()
    first.close()  # the lease is free
    leases = [Lease(c.store, clock, LEASE_S) for _ in range(6)]
    go = threading.Barrier(len(leases))
    won: list[bool] = [False] * len(leases)

    def race(i: int) -> None:
        go.wait()
        won[i] = leases[i].try_acquire()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == 1
    winner = leases[won.index(True)]
    assert winner.fencing == lease_row(c.store).fencing == 2


def test_a_clean_stop_gives_the_lease_back_at_once(make_cluster, clock):
    c, first = make_cluster()
    first.close()
    second = Engine(c.store, clock)  # no waiting for an expiry
    assert second.lease.fencing == 2
    second.close()


HOLDER = """
import sys, time
from broker.clock import SystemClock
from broker.control.lease import Lease
from broker.state.store import Store
lease = Lease(Store(sys.argv[1]), SystemClock(), 600)
assert lease.try_acquire()
print(lease.fencing, flush=True)
time.sleep(600)
"""


def test_a_dead_leader_on_this_host_is_replaced_without_waiting_for_its_lease(tmp_path):
    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "home")], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "1"
    mine = Lease(c.store, SystemClock(), 600)
    assert not mine.try_acquire()  # a live holder keeps it
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert mine.try_acquire()  # its 600 s lease has not expired, but its process is gone
    assert mine.fencing == 2


# -- health -----------------------------------------------------------------------------------
def test_health_up_stuck_down_and_never(make_cluster, clock):
    c, eng = make_cluster()
    c.clock = clock
    eng.close()  # a clean stop: the lease is free
    assert lease_row(c.store).holder is None
    h = c.health()
    assert not h.broker_up and h.down_since == clock.now() and h.fencing == 1
    assert h.summary == "broker down for 0s (stopped)"
    eng = Engine(c.store, clock)
    eng.cycle()
    eng.lease.renew(cycled=True)
    h = c.health()
    assert h.broker_up and h.leader == eng.lease.holder and h.fencing == 2
    assert h.last_cycle_age_s == 0
    clock.advance(10)
    eng.lease.renew()  # renewing, but no cycle finishes: stuck after stale_after_s (15 s)
    clock.advance(6)
    h = c.health()
    assert not h.broker_up and h.leader == eng.lease.holder and "stuck" in h.summary
    last = clock.now()
    eng.lease.renew(cycled=True)
    clock.advance(LEASE_S + 5)  # the leader died: its lease ran out 5 s ago
    h = c.health()
    assert not h.broker_up and h.leader is None and h.down_since == last
    assert "down for 20s" in h.summary
    eng.capacity.close()


def test_health_of_a_database_no_broker_ever_used(tmp_path):
    c = Client(tmp_path / "home", clock=FakeClock())
    h = c.health()
    assert not h.broker_up and not h.ever_ran and h.summary == "no broker has ever run on this database"


# -- two real brokers -----------------------------------------------------------------------
def test_two_brokers_one_acts_the_standby_takes_over_when_the_leader_is_killed(tmp_path):
    home, done = tmp_path / "home", tmp_path / "done.jsonl"
    c = Client(home)
    c.apply(parse_config(config(lease_s=3)))
    a = start_broker(home, tmp_path / "a.log")
    wait_for(lambda: c.health().broker_up)
    b = start_broker(home, tmp_path / "b.log")
    try:
        wait_for(lambda: "standby" in (tmp_path / "b.log").read_text())
        # Submitted once both are up (a broker may take seconds to start on a busy machine).
        ids = [c.submit(name=f"j{i}", team="research", command=train(15, 0.1, 3, done),
                        gpus_per_node=1).id for i in range(5)]
        wait_for(lambda: sum(c.get(i).status == "RUNNING" for i in ids) == 2)
        assert c.health().fencing == 1
        a.send_signal(signal.SIGKILL)
        a.wait()
        killed = time.monotonic()
        wait_for(lambda: c.health().fencing == 2 and c.health().broker_up)
        assert time.monotonic() - killed < 3  # within one lease period
        infos = c.wait(ids, timeout=90)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)
    assert [i.status for i in infos] == ["SUCCEEDED"] * 5
    finished = [json.loads(line)["job"] for line in done.read_text().splitlines()]
    assert sorted(finished) == sorted(str(i) for i in ids)  # each exactly once
    b_log = (tmp_path / "b.log").read_text()
    before = b_log.split("leader: fencing number 2")[0]
    assert "started" not in before and "ended" not in before  # the standby never acted
    assert not c.health().broker_up  # both stopped; b gave the lease back


def test_a_job_another_transaction_is_changing_is_skipped_not_waited_for(make_cluster, db):
    """The launch claims the job row with FOR UPDATE SKIP LOCKED: a row an API process is
    changing right now (a cancel in flight) is left for the next cycle; the cycle never
    blocks on it."""
    if db != "postgresql":
        pytest.skip("SQLite has one writer at a time: there are no row locks to skip")
    from sqlalchemy import text

    c, eng = make_cluster()
    j = c.submit(name="busy", team="research", command=train(2)).id
    with c.store.engine.connect() as other:
        tx = other.begin()
        other.execute(text("SELECT id FROM job WHERE id = :j FOR UPDATE"), {"j": j})
        t0 = time.monotonic()
        eng.cycle()
        assert time.monotonic() - t0 < 5
        assert c.get(j).status == "PENDING" and c.get(j).attempts == 0
        tx.rollback()
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")


def test_a_stale_leaders_write_that_collides_with_the_new_leaders_is_refused_as_lease_lost(
        make_cluster, clock):
    """The old leader paused with a row to insert that the new leader inserted meanwhile (both
    indexed the same checkpoint): its commit is refused by the fence (LeaseLost: it stands
    by), not by the unique constraint (an IntegrityError the loop logs as a bug; found by
    `make chaos`)."""
    from broker.state.model import Setting

    c, old = make_cluster()
    clock.advance(LEASE_S + 1)
    new = Engine(c.store, clock, old.executor)
    old.lease.renewed_at = clock.now()  # it paused right after checking its lease
    with new.store.session() as s:
        s.add(Setting(key="indexed", value={"by": "new"}))
    with pytest.raises(LeaseLost, match="fencing number 2"), old.store.session() as s:
        s.add(Setting(key="indexed", value={"by": "old"}))
    with c.store.session() as s:
        row = s.get(Setting, "indexed")
        assert row is not None and row.value == {"by": "new"}
    new.close()

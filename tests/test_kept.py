"""What the leader keeps across cycles (broker.control.kept, issue 27) equals a fresh read of
the database after any sequence of changes: submit (plain, with a dependency, an array
element), cancel, update, start, finish, preempt and requeue, a start failure, a runtime
learned, waiting reasons written, nodes added and removed. Run on SQLite and PostgreSQL: the
change counter is a trigger of each."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import Session, col, select

from broker.client.sdk import Client
from broker.control import holds
from broker.control.kept import KeptState, counter, fresh
from broker.control.snapshots import build_snapshot
from broker.policy import PolicyConfig, Snapshot
from broker.policy.reclaim_index import ReclaimIndex
from broker.spec import parse_config
from broker.state.model import Attempt, AttemptState, EndReason, Job, JobState, Node
from tests.conftest import config

pytestmark = [pytest.mark.both_dbs]
CFG = PolicyConfig()
Op = Callable[[Client, Session, random.Random, float], None]


def _jobs(s: Session, state: str) -> list[Job]:
    return list(s.exec(select(Job).where(Job.state == state).order_by(Job.id)).all())


def submit(c: Client, s: Session, rng: random.Random, now: float) -> None:
    extra: dict[str, object] = rng.choice([{}, {}, {"gpus_per_node": 2}, {"gpu_types": ["A100"]},
                                           {"expected_duration_s": 600.0}, {"priority": "high"}])
    c.submit(name="k", team=rng.choice(["research", "prod"]), command=["true"],
             experiment="e1", **extra)


def submit_held(c: Client, s: Session, rng: random.Random, now: float) -> None:
    ids = [j.id for j in _jobs(s, JobState.PENDING)]
    if ids:  # waits for another job: kept as a hold
        c.submit(name="dep", team="research", command=["true"], after=[str(rng.choice(ids))])
    else:
        c.submit(name="arr", team="research", command=["true"], array="0-2%1")


def cancel(c: Client, s: Session, rng: random.Random, now: float) -> None:
    live = _jobs(s, JobState.PENDING) + _jobs(s, JobState.RUNNING)
    if live:
        c.cancel(rng.choice(live).id or 0)  # pending: a core UPDATE; running: the flag


def update_job(c: Client, s: Session, rng: random.Random, now: float) -> None:
    pending = _jobs(s, JobState.PENDING)
    if pending:
        j = rng.choice(pending)
        j.priority, j.expected_duration_s = rng.choice(["low", "normal", "urgent"]), rng.choice([None, 60.0])
        s.add(j)


def start(c: Client, s: Session, rng: random.Random, now: float) -> None:
    pending = [j for j in _jobs(s, JobState.PENDING) if not j.cancel_requested]
    if pending:
        j = rng.choice(pending)
        s.add(Attempt(job_id=j.id or 0, number=j.attempts + 1, pool="a100", alloc=[["a100-0", [0]]],
                      priority=j.priority, state=AttemptState.RUNNING, started_at=now, gpus=1))
        j.state, j.attempts, j.waiting_reason = JobState.RUNNING, j.attempts + 1, None
        s.add(j)


def _end(s: Session, now: float, reason: EndReason, cause: str | None = None) -> None:
    running = list(s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)).all())
    if not running:
        return
    a = random.Random(int(now)).choice(running)
    a.state, a.ended_at, a.end_reason, a.cause = AttemptState.ENDED, now, reason, cause
    job = s.get(Job, a.job_id)
    assert job is not None
    if reason == EndReason.COMPLETED:
        job.state, job.end_time = JobState.SUCCEEDED, now
    else:
        job.state, job.queued_at, job.preemptions = JobState.PENDING, now, job.preemptions + 1
    s.add(a)
    s.add(job)


def finish(c: Client, s: Session, rng: random.Random, now: float) -> None:
    _end(s, now, EndReason.COMPLETED)


def preempt(c: Client, s: Session, rng: random.Random, now: float) -> None:
    running = list(s.exec(select(Attempt).where(Attempt.state == AttemptState.RUNNING)).all())
    if running and rng.random() < 0.5:  # asked to stop: STOPPING, then (next op) requeued
        a = rng.choice(running)
        a.state, a.stop_reason, a.stop_requested_at = AttemptState.STOPPING, "preempted", now
        s.add(a)
    else:
        _end(s, now, EndReason.PREEMPTED)


def start_failed(c: Client, s: Session, rng: random.Random, now: float) -> None:
    _end(s, now, EndReason.FAILED, cause="start_failed:node:no such device")


def reasons(c: Client, s: Session, rng: random.Random, now: float) -> None:
    ids = [j.id for j in _jobs(s, JobState.PENDING)]
    if ids:
        s.execute(update(Job).where(col(Job.id).in_(rng.sample(ids, min(3, len(ids)))))
                  .values(waiting_reason=rng.choice(["x", "y", None])))


def node_add(c: Client, s: Session, rng: random.Random, now: float) -> None:
    s.add(Node(id=f"a100-{rng.randrange(1, 1000)}", pool="a100", gpus=2))


def node_remove(c: Client, s: Session, rng: random.Random, now: float) -> None:
    extra = list(s.exec(select(Node).where(Node.id != "a100-0")).all())
    if extra:
        s.delete(rng.choice(extra))


OPS: list[Op] = [submit, submit, submit, submit_held, cancel, update_job, start, start, finish,
                 finish, preempt, start_failed, reasons, node_add, node_remove]


def _read(s: Session, now: float) -> tuple[Snapshot, holds.Waiting, dict[int, str | None]]:
    snap = build_snapshot(s, now, CFG, 3600.0)
    reasons = {j.id or 0: j.waiting_reason for j in _jobs(s, JobState.PENDING)}
    return snap, holds.Waiting.read(s), reasons


def _kept(k: KeptState, s: Session, now: float) -> tuple[Snapshot, holds.Waiting, dict[int, str | None]]:
    k.refresh(s)
    snap = k.sync_queue(k.snapshot(s, now, CFG, 3600.0, None))
    return snap, k.waiting(), dict(k.reasons)


def _same(a: tuple[Snapshot, holds.Waiting, dict[int, str | None]],
          b: tuple[Snapshot, holds.Waiting, dict[int, str | None]]) -> None:
    (sa, wa, ra), (sb, wb, rb) = a, b
    by_id = lambda vs: sorted(vs, key=lambda v: getattr(v, "attempt_id", None) or v.job_id)  # noqa: E731
    assert by_id(sa.pending) == by_id(sb.pending)
    assert by_id(sa.running) == by_id(sb.running)
    assert (sa.pools, sa.teams) == (sb.pools, sb.teams)
    assert (wa.members, wa.backoff, wa.after) == (wb.members, wb.backoff, wb.after)
    assert ra == rb


@pytest.mark.parametrize("seed", [1, 2])
def test_kept_state_equals_a_fresh_read_after_any_changes(tmp_path: Path, seed: int) -> None:
    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    rng = random.Random(seed)
    k = KeptState()
    now = 1000.0
    with c.store.session() as s:
        _same(_kept(k, s, now), _read(s, now))
    for step in range(90):
        op = rng.choice(OPS)
        now += 10.0
        with c.store.session() as s:
            op(c, s, rng, now)
        if rng.random() < 0.3:  # the leader writes reasons for some jobs (not read back)
            with c.store.session() as s:
                k.write_reasons(s, {jid: rng.choice(["p", "q"]) for jid in k.reasons if rng.random() < 0.5})
        with c.store.session() as s:
            kept = _kept(k, s, now)
            _same(kept, _read(s, now))
            if step % 5 == 0:
                _same(kept, _kept(fresh(s), s, now))  # and a new leader's first read
            q, ix = kept[0].queue, kept[0].reclaim_index
            assert q is not None and sorted(q.jobs) == sorted(p.job_id for p in kept[0].pending), step
            assert ix is not None
            _same_index(ix, ReclaimIndex(kept[0].running, ix.aged_after, ix.gangs_only))


def _same_index(a: ReclaimIndex, b: ReclaimIndex) -> None:
    assert (a.size, a.stopping, a.live, a.rank, a.count) == (b.size, b.stopping, b.live, b.rank, b.count)
    assert ({n: c for n, c in a.below.items() if any(c)}, a.order, a.keys) == (b.below, b.order, b.keys)


def test_a_refresh_with_nothing_changed_reads_nothing_and_a_new_fencing_number_rebuilds(
        tmp_path: Path) -> None:
    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    c.submit(name="k", team="research", command=["true"])
    k = KeptState()
    with c.store.session() as s:
        assert k.refresh(s, fencing=1).rebuilt
        assert (k.refresh(s, fencing=1).jobs, k.refresh(s, fencing=1).rebuilt) == (0, False)
        assert k.refresh(s, fencing=2).rebuilt  # another term: the database may have changed
    before = k.seen
    c.submit(name="k2", team="research", command=["true"])
    with c.store.session() as s:
        assert counter(s) > (before or 0)
        got = k.refresh(s, fencing=2)
        assert (got.jobs, got.rebuilt) == (1, False) and len(k.views) == 2


def test_only_changed_reasons_are_written(tmp_path: Path) -> None:
    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    ids = [c.submit(name="k", team="research", command=["true"]).id for _ in range(3)]
    k = KeptState()
    with c.store.session() as s:
        k.refresh(s)
        assert k.write_reasons(s, {ids[0]: "a", ids[1]: "a", ids[2]: "b"}) == 3
    with c.store.session() as s:
        k.refresh(s)
        assert k.write_reasons(s, {ids[0]: "a", ids[1]: "b", ids[2]: "b"}) == 1
    with c.store.session() as s:
        assert [c.get(i).waiting_reason for i in ids] == ["a", "b", "b"]
        assert k.refresh(s).jobs == 0  # its own writes are not read back
        c.cancel(ids[0])
        assert k.refresh(s).jobs == 1 and k.write_reasons(s, {ids[1]: "b", ids[2]: "c"}) == 1


def test_a_runtime_learned_from_finished_jobs_reaches_the_kept_pending_views(tmp_path: Path) -> None:
    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    rng = random.Random(3)
    k = KeptState()
    now = 1000.0
    for _ in range(5):  # MIN_RUNS finished runs of (research, e1), and one that waits
        c.submit(name="k", team="research", command=["true"], experiment="e1")
    for _ in range(4):
        with c.store.session() as s:
            start(c, s, rng, now)
            k.refresh(s)
        now += 100.0
        with c.store.session() as s:
            finish(c, s, rng, now)
    with c.store.session() as s:
        kept = _kept(k, s, now)
        assert [v.expected_duration_s for v in kept[0].pending] == [100.0]
        _same(kept, _read(s, now))


def test_on_postgresql_a_writer_waits_for_the_counter_until_the_one_before_commits(
        tmp_path: Path, db: str) -> None:
    """Numbers become visible in the order they were given: the second writer cannot take one
    while the first has not committed, so a reader never sees k + 1 without k."""
    if db != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    a, b = (c.submit(name="k", team="research", command=["true"]).id for _ in range(2))
    k = KeptState()
    with c.store.session() as s:
        k.refresh(s)
    first, second = c.store.engine.connect(), c.store.engine.connect()
    try:
        tx = first.begin()
        first.execute(update(Job).where(col(Job.id) == a).values(priority="low"))
        with second.begin():
            second.execute(text("SET LOCAL lock_timeout = '200ms'"))
            with pytest.raises(OperationalError, match="lock timeout"):
                second.execute(update(Job).where(col(Job.id) == b).values(priority="low"))
        with c.store.session() as s:
            assert k.refresh(s).jobs == 0  # not committed: not seen, and not skipped either
        tx.commit()
        with c.store.session() as s:
            assert k.refresh(s).jobs == 1 and k.views[a].priority.value == "low"
    finally:
        first.close()
        second.close()

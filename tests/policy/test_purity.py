"""plan() is pure and deterministic, and its plans keep the cycle's invariants on many
generated snapshots (fixed seeds, so every run checks the same cases)."""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from collections import defaultdict

import pytest

from broker.policy import PendingQueue, Plan, Snapshot, plan
from broker.policy.activity import can_act, summarize
from broker.policy.backfill import ready_times
from broker.spec import market_ok

from .builders import job, placed, pool, running, snap, team

SEEDS = range(120)
INF = math.inf


def random_snapshot(seed: int) -> Snapshot:
    rnd = random.Random(seed)
    pools = []
    for i in range(rnd.randint(1, 3)):
        pools.append(pool(
            f"p{i}", rnd.choice(["A100", "H100"]), nodes=rnd.randint(1, 4),
            gpus=rnd.choice([4, 8]), market=rnd.choice(["onprem", "on_demand", "spot"]),
            price=rnd.choice([0.0, 1.0, 2.0]),
            teams=rnd.choice([None, None, None, {"a"}, {"b", "c"}])))
    pending_ids = list(range(1, rnd.randint(1, 14) + 1))
    run = []
    aid = 100
    left = {nd.id: nd.gpus for p in pools for nd in p.nodes}
    for p in pools:
        for nd in p.nodes:
            while left[nd.id] and rnd.random() < 0.7:
                g = rnd.randint(1, left[nd.id])
                left[nd.id] -= g
                aid += 1
                started = float(rnd.randint(0, 1000))
                stopping = rnd.random() < 0.15
                alloc = {nd.id: g}
                others = [x.id for x in p.nodes if x.id != nd.id and left[x.id] >= g]
                if others and rnd.random() < 0.15:  # an attempt spanning two nodes
                    other = rnd.choice(others)
                    alloc[other] = g
                    left[other] -= g
                run.append(running(
                    aid, aid + 1000, team=rnd.choice("abc"),
                    prio=rnd.choice(["low", "normal", "high", "urgent"]), alloc=alloc,
                    started=started, end=rnd.choice([None, 900.0, 1500.0, 4000.0]),
                    ckpt=rnd.choice([None, started + rnd.randint(0, 200)]),
                    preempted=rnd.choice([0, 0, 1, 2]), stopping=stopping,
                    stopping_for=rnd.choice([*pending_ids, None]) if stopping else None))
    pending = [
        job(jid, team=rnd.choice("abc"), prio=rnd.choice(["low", "normal", "high", "urgent"]),
            gpus=rnd.choice([1, 2, 4, 8]), nodes=rnd.choice([1, 1, 1, 2]),
            types=rnd.choice([(), (), ("A100",), ("H100",), ("A100", "H100")]),
            submit=float(rnd.randint(0, 50)), spot=rnd.choice(["never", "allowed", "only"]),
            estimate=rnd.choice([None, 100.0, 1000.0, 5000.0]))
        for jid in pending_ids
    ]
    teams = [team(t, weight=rnd.choice([0.0, 0.5, 1.0, 2.0]), allowance=rnd.choice([4, 8, 1 << 30]),
                  usage=float(rnd.randint(0, 1000))) for t in "abc"]
    config = dict(
        classes=rnd.random() < 0.9, fair_share=rnd.random() < 0.8,
        anti_capture=rnd.random() < 0.7, preemption=rnd.random() < 0.8,
        victim_order=rnd.choice(["checkpoint", "youngest"]),
        min_run_s=rnd.choice([0.0, 300.0]), backfill=rnd.random() < 0.8,
        reservations=rnd.choice([0, 1, 2]), easy=rnd.random() < 0.6,
        promote_after_s=rnd.choice([None, None, 500.0]))
    rnd.shuffle(run)
    rnd.shuffle(pending)
    return snap(pools, running=run, pending=pending, teams=teams, now=1000.0, **config)


# -- purity and determinism -----------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS[:40])
def test_plan_does_not_change_its_snapshot(seed):
    s = random_snapshot(seed)
    before, text = copy.deepcopy(s), repr(s)
    parts = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    items = {k: list(v) for k, v in parts.items() if isinstance(v, tuple)}
    plan(s)
    assert s == before
    assert repr(s) == text
    for k, v in parts.items():
        assert getattr(s, k) is v
    for k, v in items.items():
        assert all(a is b for a, b in zip(getattr(s, k), v, strict=True))


@pytest.mark.parametrize("seed", SEEDS[:40])
def test_plan_is_deterministic(seed):
    s = random_snapshot(seed)
    first = plan(s)
    assert isinstance(first, Plan)
    assert plan(s) == first
    assert plan(copy.deepcopy(s)) == first
    assert repr(plan(s)) == repr(first)


@pytest.mark.parametrize("seed", SEEDS[:40])
def test_input_order_of_jobs_and_attempts_does_not_matter(seed):
    s = random_snapshot(seed)
    flipped = dataclasses.replace(s, pending=s.pending[::-1], running=s.running[::-1])
    assert plan(flipped) == plan(s)


# -- invariants -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_plan_invariants(seed):
    s = random_snapshot(seed)
    p = plan(s)
    pools = {pl.name: pl for pl in s.pools}
    size = {nd.id: nd.gpus for pl in s.pools for nd in pl.nodes}
    pend = {j.job_id: j for j in s.pending}
    run = {r.attempt_id: r for r in s.running}
    cfg = s.config

    # every pending job is either placed or waiting, once
    placed_ids = [pl.job_id for pl in p.placements]
    waiting_ids = [jid for jid, _ in p.waiting]
    assert sorted(placed_ids + waiting_ids) == sorted(pend)
    assert all(why for _, why in p.waiting)

    # placements: whole gang in one admissible pool
    for pl in p.placements:
        j, pv = pend[pl.job_id], pools[pl.pool]
        assert len(pl.alloc) == j.nodes
        assert len({nd for nd, _ in pl.alloc}) == j.nodes
        assert all(g == j.gpus_per_node for _, g in pl.alloc)
        assert {nd for nd, _ in pl.alloc} <= {nd.id for nd in pv.nodes}
        assert not j.gpu_types or pv.gpu_type in j.gpu_types
        assert market_ok(j.spot, pv.market)
        assert pv.teams is None or j.team in pv.teams
        if pl.priority != j.priority:  # anti-capture, or aging (low to normal only)
            aged = (cfg.promote_after_s is not None and s.now - j.submit_time >= cfg.promote_after_s
                    and pl.priority.rank == j.priority.rank + 1 == 1)
            assert pl.job_id in p.demoted or aged

    # no node over capacity: running (victims still hold theirs) + placed + held
    use: dict[str, int] = defaultdict(int)
    for r in s.running:
        for nd, g in r.alloc:
            use[nd] += g
    for pl in p.placements:
        for nd, g in pl.alloc:
            use[nd] += g
    for _, alloc in p.reservations:
        for nd, g in alloc:
            assert g > 0
            use[nd] += g
    assert all(use[nd] <= size[nd] for nd in use)

    # preemptions: each victim once, running, not stopping, not protected, lower class
    aids = [pe.attempt_id for pe in p.preemptions]
    assert len(aids) == len(set(aids))
    assert cfg.preemption or not aids
    for pe in p.preemptions:
        r = run[pe.attempt_id]
        assert pe.job_id == r.job_id
        assert not r.stopping
        assert r.times_preempted == 0 or s.now - r.started_at >= cfg.min_run_s
        assert pe.for_job_id in waiting_ids
        if not cfg.anti_capture:
            assert r.priority.rank < pend[pe.for_job_id].priority.rank
        else:  # a demoted attempt counts as normal at most
            assert min(r.priority.rank, 1) < pend[pe.for_job_id].priority.rank

    # reservations and demotions name waiting / priority jobs, once each
    held_ids = [jid for jid, _ in p.reservations]
    assert len(held_ids) == len(set(held_ids))
    assert set(held_ids) <= set(waiting_ids)
    assert len(p.demoted) == len(set(p.demoted))
    assert all(pend[jid].priority.rank >= 2 for jid in p.demoted)  # aging never reaches high
    if not cfg.anti_capture:
        assert p.demoted == ()


def test_invariant_generator_covers_the_interesting_paths():
    # guard against a generator that never preempts, reserves, demotes or waits
    plans = [plan(random_snapshot(seed)) for seed in SEEDS]
    assert sum(len(p.preemptions) for p in plans) >= 10
    assert sum(len(p.reservations) for p in plans) >= 10
    assert sum(len(p.demoted) for p in plans) >= 5
    assert sum(len(p.placements) for p in plans) >= 50
    assert sum(len(p.starts) for p in plans) >= 5  # EASY reservations with a known start
    assert sum(p.wake_at is not None for p in plans) >= 5
    reasons = {why.split(":")[0].split(" (")[0] for p in plans for _, why in p.waiting}
    assert {"no pool matches its GPU types, spot policy and shape", "head of the queue",
            "waiting for preempted jobs to stop", "no free GPUs of an acceptable type",
            "behind a blocked job"} <= reasons


# -- scale ----------------------------------------------------------------------------------


def test_large_cycle_is_fast_and_fills_exactly():
    pools = [pool("a", nodes=1000, gpus=8), pool("b", "H100", nodes=500, gpus=8)]
    pending = [job(i, team="abc"[i % 3], gpus=(1, 2, 4, 8)[i % 4], submit=i)
               for i in range(1, 4001)]
    s = snap(pools, pending=pending)
    t0 = time.perf_counter()
    p = plan(s)
    elapsed = time.perf_counter() - t0
    # 4000 jobs ask for 15000 GPUs of the 12000: exactly the free GPUs are used
    got = placed(p)
    assert sum(sum(alloc.values()) for _, alloc in got.values()) == 12000
    assert len(got) + len(p.waiting) == 4000
    assert elapsed < 2.0


@pytest.mark.parametrize("seed", SEEDS[:40])
def test_a_queue_kept_across_cycles_plans_like_a_fresh_one(seed):
    """The simulator keeps a PendingQueue across cycles (adds and removes); plan() must decide
    exactly as from the snapshot's pending jobs."""
    s = random_snapshot(seed)
    rnd = random.Random(seed)
    q = PendingQueue()
    gone = []
    for j in s.pending:
        q.add(j)
        if rnd.random() < 0.3:  # a job that came and went
            extra = dataclasses.replace(j, job_id=j.job_id + 10_000)
            q.add(extra)
            gone.append(extra)
    for j in gone:
        q.remove(j)
    assert len(q) == len(s.pending)
    assert plan(dataclasses.replace(s, queue=q)) == plan(s)


def with_node_indexes(s: Snapshot, computed_at: float) -> Snapshot:
    """The snapshot with every node carrying what a simulator keeps across cycles: its used
    GPUs, its attempts' release times and the ready index (computed at `computed_at`)."""
    used: dict[str, int] = defaultdict(int)
    rel: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in s.running:
        if r.stopping:
            end = s.now + s.config.grace_s if r.stopping_for is None else math.inf
        else:
            end = r.expected_end if r.expected_end is not None else math.inf
        for nd, g in r.alloc:
            used[nd] += g
            rel[nd].append((end, g))
    pools = []
    for p in s.pools:
        nodes = []
        for nd in p.nodes:
            releases = tuple(sorted(rel[nd.id]))
            ready, until = ready_times(nd.gpus - used[nd.id], releases, nd.gpus, computed_at)
            nodes.append(dataclasses.replace(nd, used=used[nd.id], releases=releases, ready=ready,
                                             ready_until=until))
        pools.append(dataclasses.replace(p, nodes=tuple(nodes)))
    return dataclasses.replace(s, pools=tuple(pools))


@pytest.mark.parametrize("seed", SEEDS[:60])
@pytest.mark.parametrize("computed_at", [0.0, 1000.0], ids=["index-from-earlier", "index-now"])
def test_nodes_carrying_their_indexes_plan_like_bare_ones(seed, computed_at):
    """An index computed earlier (some estimate since overrun) or now must not change a plan."""
    s = random_snapshot(seed)
    assert plan(with_node_indexes(s, computed_at)) == plan(s)


@pytest.mark.parametrize(
    ("free", "releases", "expect"),
    [
        pytest.param(2, (), ((1000.0, 1000.0, INF, INF), INF), id="free-only"),
        pytest.param(1, ((1500.0, 2), (2000.0, 1)), ((1000.0, 1500.0, 1500.0, 2000.0), 1500.0),
                     id="releases-in-order"),
        pytest.param(0, ((900.0, 2), (2000.0, 2)), ((2000.0, 2000.0, INF, INF), 2000.0),
                     id="an-overrun-counts-for-nothing"),
        pytest.param(0, ((1200.0, 2), (INF, 2)), ((1200.0, 1200.0, INF, INF), 1200.0),
                     id="no-estimate-never-ends"),
    ],
)
def test_ready_times(free, releases, expect):
    assert ready_times(free, releases, 4, 1000.0) == expect


@pytest.mark.parametrize("seed", SEEDS)
def test_when_nothing_can_act_the_plan_does_nothing(seed):
    """broker.policy.activity.can_act is the simulator's shortcut: when it says no, plan()
    must place, preempt, launch and terminate nothing."""
    s = random_snapshot(seed)
    if can_act(summarize(s), s.config):
        return
    p = plan(s)
    assert (p.placements, p.preemptions, p.launches, p.terminations) == ((), (), (), ())


def test_the_can_act_check_is_exercised_both_ways():
    answers = {can_act(summarize(s), s.config) for s in map(random_snapshot, SEEDS)}
    assert answers == {True, False}

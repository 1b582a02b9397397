"""The plan's private indexes against brute force: the victim index (victims in order per node
and per pool, GPUs reclaimable per node and class, before and after victims are chosen) and
the queue's FIFO lists (sorted by submit time and id through adds and removes).

Table-driven: each case is a small cluster built with the shared builders; the expected
values are recomputed here from the definitions in broker/policy/victims.py and queue.py.
"""

from __future__ import annotations

import pytest

from broker.policy import PendingQueue
from broker.policy.capacity import Capacity
from broker.policy.queue import list_key
from broker.policy.reclaim_index import victim_key
from broker.policy.victims import VictimIndex

from .builders import NOW, job, pool, running

RANK = {"low": 0, "normal": 1, "high": 2, "urgent": 3}

VICTIM_CASES = [
    pytest.param(
        [pool("a", nodes=2)],
        [running(1, 11, prio="low", alloc={"a-0": 4}, started=900),
         running(2, 12, prio="normal", alloc={"a-0": 2}, started=100),
         running(3, 13, prio="low", alloc={"a-1": 8}, started=500, ckpt=990)],
        set(), 4, id="one-pool:low-before-normal,least-lost-first",
    ),
    pytest.param(
        [pool("a", nodes=3)],
        # a gang on a-2 and a-0 (listed out of place order), a single on a-1
        [running(1, 11, prio="low", alloc={"a-2": 8, "a-0": 8}, started=950),
         running(2, 12, prio="low", alloc={"a-1": 4}, started=10)],
        set(), 4, id="spanning-victim:once-per-node,nodes-by-place",
    ),
    pytest.param(
        [pool("a", nodes=2), pool("b", nodes=2, gpu_type="V100")],
        [running(1, 11, prio="high", alloc={"a-0": 8}, started=0),
         running(2, 12, prio="high", alloc={"b-0": 4}, started=0),
         running(3, 13, prio="normal", alloc={"b-1": 4}, started=300),
         running(4, 14, prio="low", alloc={"a-1": 1}, started=300)],
        {1}, 4, id="two-pools:demoted-high-counts-as-normal",
    ),
    pytest.param(
        [pool("a", nodes=2)],
        [running(1, 11, prio="normal", alloc={"a-0": 4}, started=0),
         running(2, 12, prio="low", alloc={"a-0": 4}, started=0, stopping=True),
         running(3, 13, prio="low", alloc={"a-1": 2}, started=NOW - 10, preempted=1),
         running(4, 14, prio="high", alloc={"a-1": 2}, started=0),
         running(5, 15, prio="low", alloc={"gone-0": 8}, started=0)],
        set(), 2, id="not-eligible:stopping,min-run,class-at-or-above-top,unknown-node",
    ),
]


def _rank(r, demoted):  # type: ignore[no-untyped-def]
    return 1 if r.attempt_id in demoted else RANK[r.priority.value]


def _eligible(rs, demoted, below, min_run_s):  # type: ignore[no-untyped-def]
    return [r for r in rs if not r.stopping
            and not (r.times_preempted and NOW - r.started_at < min_run_s)
            and _rank(r, demoted) < below]


@pytest.mark.parametrize(("pools", "rs", "demoted", "below"), VICTIM_CASES)
def test_victim_index_orders_and_counts_like_brute_force(pools, rs, demoted, below):  # type: ignore[no-untyped-def]
    min_run_s = 600.0
    cap = Capacity(tuple(pools), rs)
    vi = VictimIndex(rs, demoted, cap, NOW, min_run_s, "checkpoint", below=below)
    elig = _eligible(rs, demoted, below, min_run_s)
    key = {r.attempt_id: victim_key(r, _rank(r, demoted), NOW, "checkpoint") for r in elig}
    place = {nd.id: i for p in pools for i, nd in enumerate(p.nodes)}
    pool_of = {nd.id: p.name for p in pools for nd in p.nodes}
    assert vi.lowest == min((_rank(r, demoted) for r in elig), default=None)
    for p in pools:
        want = sorted(((key[r.attempt_id], place[nd]), r.attempt_id, nd, g) for r in elig
                      for nd, g in r.alloc if pool_of.get(nd) == p.name)
        got = [(e[1].attempt_id, e[3], e[2]) for e in vi.per_pool(p.name)]
        assert got == [(aid, nd, g) for _, aid, nd, g in want]
        for nd in p.nodes:
            want_node = sorted((key[r.attempt_id], r.attempt_id, g) for r in elig
                               for x, g in r.alloc if x == nd.id)
            got_node = [(e[0], e[1].attempt_id, e[2]) for e in vi.by_node.get(nd.id, [])]
            assert got_node == want_node

    def could_fit(pool_name, rank, g, n, chosen):  # type: ignore[no-untyped-def]
        fits = 0
        for nd in next(p for p in pools if p.name == pool_name).nodes:
            reach = cap.avail(nd.id) + sum(gg for r in elig if _rank(r, demoted) < rank
                                           and r.attempt_id not in chosen
                                           for x, gg in r.alloc if x == nd.id)
            fits += min(reach, nd.gpus) >= g
        return fits >= n

    chosen: set[int] = set()
    for step in range(2):
        for p in pools:
            for rank in (1, 2, 3):
                for g in (1, 4, 6, 8):
                    for n in (1, 2):
                        assert vi.could_fit(p.name, rank, g, n) == could_fit(p.name, rank, g, n, chosen), (
                            step, p.name, rank, g, n)
        if step == 0 and elig:  # choose the first victim in order: its GPUs no longer count
            first = min(elig, key=lambda r: key[r.attempt_id])
            vi.choose([first])
            chosen.add(first.attempt_id)


QUEUE_CASES = [
    pytest.param([job(3, submit=5), job(1, submit=5), job(2, submit=1)], [], id="ties-by-id"),
    pytest.param([job(1, prio="high", submit=9), job(2, prio="high", submit=3),
                  job(3, prio="low", gpus=2, submit=1), job(4, team="b", submit=0)],
                 [job(5, prio="high", submit=4), job(6, submit=0)], id="several-lists"),
    pytest.param([job(1, gpus=8, nodes=2, submit=2), job(2, gpus=8, nodes=2, submit=2)],
                 [job(3, gpus=8, nodes=2, submit=2)], id="same-submit-gang",
                 ),
]


@pytest.mark.parametrize(("first", "later"), QUEUE_CASES)
def test_queue_lists_stay_sorted_through_adds_and_removes(first, later):  # type: ignore[no-untyped-def]
    q = PendingQueue(first)
    for j in later:
        q.add(j)
    q.remove(first[0])
    left = [*first[1:], *later]
    want: dict[object, list[int]] = {}
    for j in sorted(left, key=lambda j: (j.submit_time, j.job_id)):
        want.setdefault(list_key(j), []).append(j.job_id)
    assert {k: [j.job_id for j in lst] for k, lst in q.lists.items()} == want
    assert sorted(q.jobs) == sorted(j.job_id for j in left)
    with pytest.raises(KeyError):
        q.remove(first[0])

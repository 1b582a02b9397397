"""FreeIndex, the free GPUs per node a caller keeps across cycles (the simulator does): kept
through several cycles of node changes, it must give plan() exactly the plan plan() makes
from the nodes themselves, and hold what a fresh index would.

Table-driven: each case is a list of cycles (pools, running attempts, pending jobs, config)
built with the shared builders; between cycles the test updates one index the way a caller
does (add the nodes that joined, last; set the ones whose free GPUs changed; drop the ones
that left).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from broker.policy import NodeView, PoolView, RunningView, Snapshot, plan
from broker.policy.free_index import FreeIndex

from .builders import job, pool, running, snap


def _free(p: PoolView, rs: tuple[RunningView, ...]) -> dict[str, int]:
    """What plan() derives per node: min(gpus, GPUs per node) - used, at least 0."""
    used: dict[str, int] = defaultdict(int)
    for r in rs:
        for nd, g in r.alloc:
            used[nd] += g
    out = {}
    for nd in p.nodes:
        u = nd.used if nd.used is not None else used[nd.id]
        out[nd.id] = max(0, min(nd.gpus, p.gpus_per_node) - u)
    return out


def fresh(s: Snapshot) -> FreeIndex:
    ix = FreeIndex()
    for p in s.pools:
        ix.add_pool(p.name, p.gpus_per_node)
        for nd, f in _free(p, s.running).items():
            ix.add(p.name, nd, f)
    return ix


def follow(ix: FreeIndex, s: Snapshot) -> None:
    """Bring a kept index to the snapshot, as a caller does between cycles."""
    for p in s.pools:
        free = _free(p, s.running)
        for nd in [n for n in ix.nodes[p.name] if n not in free]:
            ix.drop(nd)
        for nd, f in free.items():
            if nd in ix.pool_of:
                ix.set(nd, f)
            else:
                ix.add(p.name, nd, f)


def grown(p: PoolView, *ids: str, gone: tuple[str, ...] = ()) -> PoolView:
    """The pool with nodes `ids` added last and `gone` removed (a rented pool's churn)."""
    nodes = tuple(nd for nd in p.nodes if nd.id not in gone) + tuple(
        NodeView(i, p.gpus_per_node) for i in ids)
    return replace(p, nodes=nodes)


A2 = pool("a", nodes=3)
B = pool("b", nodes=2, gpu_type="V100")
RENTED = replace(pool("s", nodes=1, market="spot", price=1.0), max_nodes=4)

CASES = [
    pytest.param([
        snap([A2], [running(1, 11, alloc={"a-0": 8}), running(2, 12, alloc={"a-1": 4})],
             [job(1, gpus=4), job(2, gpus=8), job(3, gpus=2)]),
        snap([A2], [running(2, 12, alloc={"a-1": 4}), running(3, 13, alloc={"a-2": 6})],
             [job(2, gpus=8), job(3, gpus=2), job(4, gpus=1)]),
        snap([A2], [running(3, 13, alloc={"a-2": 6})], [job(5, gpus=3), job(6, gpus=8)]),
    ], id="one-pool:frees-move-between-buckets,best-fit-order"),
    pytest.param([
        snap([A2, B], [running(1, 11, prio="low", alloc={"a-0": 8, "a-1": 8}, started=100),
                       running(2, 12, prio="normal", alloc={"b-0": 8})],
             [job(9, prio="high", gpus=8, nodes=2, submit=900), job(10, gpus=4, types=("V100",))],
             preemption=True, min_run_s=0),
        snap([A2, B], [running(1, 11, prio="low", alloc={"a-0": 8, "a-1": 8}, started=100,
                               stopping=True, stopping_for=9),
                       running(2, 12, prio="normal", alloc={"b-0": 8})],
             [job(9, prio="high", gpus=8, nodes=2, submit=900), job(10, gpus=4, types=("V100",))],
             preemption=True, min_run_s=0),
        snap([A2, B], [running(2, 12, prio="normal", alloc={"b-0": 8}),
                       running(3, 19, prio="high", alloc={"a-0": 8, "a-1": 8})],
             [job(10, gpus=4, types=("V100",)), job(11, prio="low", gpus=8)],
             preemption=True, min_run_s=0),
    ], id="two-pools:gang-preempts,victim-stops,gang-starts"),
    pytest.param([
        snap([A2, RENTED], [running(1, 11, alloc={"a-0": 8, "a-1": 8, "a-2": 8})],
             [job(1, gpus=8, estimate=600), job(2, gpus=2)], easy=True),
        snap([A2, grown(RENTED, "s-1", "s-2")],
             [running(1, 11, alloc={"a-0": 8, "a-1": 8, "a-2": 8}),
              running(2, 12, alloc={"s-1": 8})], [job(2, gpus=2), job(3, gpus=8)], easy=True),
        snap([A2, grown(RENTED, "s-1", "s-2", "s-3", gone=("s-0",))],
             [running(2, 12, alloc={"s-1": 8}), running(3, 13, alloc={"s-3": 9})],
             [job(4, gpus=8), job(5, gpus=1, estimate=60)], easy=True),
    ], id="rented-pool:nodes-join-last,leave,over-committed-node-counts-0"),
]


@pytest.mark.parametrize("cycles", CASES)
def test_index_kept_across_cycles_plans_like_the_nodes(cycles: list[Snapshot]) -> None:
    kept = fresh(cycles[0])
    for s in cycles:
        follow(kept, s)
        want = plan(s)
        assert plan(replace(s, free_index=kept)) == want
        assert plan(replace(s, free_index=fresh(s))) == want
        new = fresh(s)
        assert kept.free == new.free and kept.nodes == new.nodes and kept.pool_of == new.pool_of
        for p in s.pools:  # the same nodes per bucket, in the pool's order
            assert kept.ordered_buckets(p.name) == new.ordered_buckets(p.name)
            assert [list(b) for b in kept.ordered_buckets(p.name)] == [
                list(b) for b in new.ordered_buckets(p.name)]


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: replace(s, pools=s.pools[:1]), "its pools are not the snapshot's"),
    (lambda s: replace(s, pools=(grown(s.pools[0], "a-9"), s.pools[1])), "pool 'a' differs"),
])
def test_an_index_that_disagrees_with_the_snapshot_is_refused(change, message):  # type: ignore[no-untyped-def]
    s = snap([A2, B], [], [job(1)])
    with pytest.raises(ValueError, match=message):
        plan(change(replace(s, free_index=fresh(s))))


@pytest.mark.parametrize(("ops", "free", "buckets"), [
    ([("set", "a-1", 3), ("set", "a-0", 3)], {"a-0": 3, "a-1": 3, "a-2": 8},
     {3: ["a-0", "a-1"], 8: ["a-2"]}),
    ([("set", "a-2", -1), ("set", "a-0", 12)], {"a-0": 8, "a-1": 8, "a-2": 0},
     {8: ["a-0", "a-1"]}),
    ([("drop", "a-0", 0), ("add", "a-0", 2), ("drop", "zz", 0)], {"a-1": 8, "a-2": 8, "a-0": 2},
     {2: ["a-0"], 8: ["a-1", "a-2"]}),
], ids=["bucket-keeps-pool-order", "clamped-to-0..size", "re-added-node-goes-last"])
def test_index_operations(ops, free, buckets):  # type: ignore[no-untyped-def]
    ix = fresh(snap([A2]))
    for op, nd, f in ops:
        if op == "set":
            ix.set(nd, f)
        elif op == "add":
            ix.add("a", nd, f)
        else:
            ix.drop(nd)
    assert ix.free == free
    got = {f: list(b) for f, b in enumerate(ix.ordered_buckets("a")) if b}
    assert got == buckets
    with pytest.raises(ValueError):
        ix.add("a", "a-1", 1)

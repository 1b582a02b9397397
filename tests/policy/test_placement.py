"""Steps 4a/4b: candidate pools (type, spot policy, partition, shape), gang all-or-none,
and which pool and nodes a job lands on."""

from __future__ import annotations

import pytest

from broker.policy import plan

from .builders import held, job, placed, placed_pools, pool, running, snap, waiting

NO_POOL = "no pool matches"

# -- gang all-or-none -----------------------------------------------------------------------

GANG_CASES = [
    pytest.param(
        [pool("a"), pool("b")], [], {7: ("a", {"a-0": 8, "a-1": 8})}, id="both-nodes-of-one-pool",
    ),
    pytest.param(
        # a-1 and b-0 are busy: one free node in each pool -> never split across pools
        [pool("a"), pool("b")],
        [running(1, 1, prio="urgent", alloc={"a-1": 8}),
         running(2, 2, prio="urgent", alloc={"b-0": 8})],
        {}, id="not-split-across-pools",
    ),
    pytest.param(
        # a-1 has 7 free, not 8: no partial placement on a-0 alone
        [pool("a")], [running(1, 1, prio="urgent", alloc={"a-1": 1})], {},
        id="not-partial-in-one-pool",
    ),
    pytest.param(
        # a has one free node; b (busier elsewhere) has two -> b
        [pool("a"), pool("b", nodes=3)],
        [running(1, 1, prio="urgent", alloc={"a-1": 8}),
         running(2, 2, prio="urgent", alloc={"b-1": 8})],
        {7: ("b", {"b-0": 8, "b-2": 8})}, id="goes-to-the-pool-that-holds-the-gang",
    ),
]


@pytest.mark.parametrize(("pools", "busy", "expect"), GANG_CASES)
def test_gang_all_or_none(pools, busy, expect):
    p = plan(snap(pools, running=busy, pending=[job(7, prio="normal", gpus=8, nodes=2)]))
    assert placed(p) == expect
    if not expect:
        assert 7 in waiting(p)
        # what it holds stays inside one pool too
        assert len({node.split("-")[0] for node in held(p).get(7, {})}) <= 1
    assert p.preemptions == ()


def test_gang_never_split_even_with_enough_gpus_in_total():
    # 4 free GPUs on each of four nodes of one pool: 16 free, but no node holds 8.
    busy = [running(i, i, prio="urgent", alloc={f"a-{i}": 4}) for i in range(4)]
    p = plan(snap([pool("a", nodes=4)], running=busy, pending=[job(7, gpus=8, nodes=2)]))
    assert p.placements == ()
    assert 7 in waiting(p)


# -- GPU type, spot policy, partitions ------------------------------------------------------

TYPE_POOLS = [pool("a100", "A100", price=1.0), pool("h100", "H100", price=2.0),
              pool("l4", "L4", gpus=4, price=0.5)]

TYPE_CASES = [
    pytest.param((), "l4", id="any-type:cheapest"),
    pytest.param(("H100",), "h100", id="only-H100"),
    pytest.param(("A100", "H100"), "a100", id="A100-or-H100:cheaper"),
    pytest.param(("H100", "A100"), "a100", id="list-order-is-not-preference"),
    pytest.param(("V100",), None, id="unknown-type-waits"),
    pytest.param(("a100",), None, id="type-is-case-sensitive"),
]


@pytest.mark.parametrize(("types", "expect"), TYPE_CASES)
def test_gpu_type_matching(types, expect):
    p = plan(snap(TYPE_POOLS, pending=[job(1, gpus=2, types=types)]))
    if expect is None:
        assert p.placements == ()
        assert NO_POOL in waiting(p)[1]
        assert p.reservations == ()
    else:
        assert placed_pools(p) == {1: expect}


def test_gpu_type_excludes_a_pool_even_when_it_is_the_only_one_free():
    busy = running(1, 1, prio="urgent", alloc={"h100-0": 8, "h100-1": 8})
    p = plan(snap(TYPE_POOLS, running=[busy], pending=[job(2, gpus=2, types=("H100",))]))
    assert p.placements == ()
    assert held(p) == {2: {}}  # it reserves the H100 nodes, but nothing there is free
    assert "next to start in h100" in waiting(p)[2]


SPOT_CASES = [
    pytest.param("never", "onprem", True, id="never:onprem-ok"),
    pytest.param("never", "on_demand", True, id="never:on_demand-ok"),
    pytest.param("never", "spot", False, id="never:spot-excluded"),
    pytest.param("allowed", "onprem", True, id="allowed:onprem-ok"),
    pytest.param("allowed", "on_demand", True, id="allowed:on_demand-ok"),
    pytest.param("allowed", "spot", True, id="allowed:spot-ok"),
    pytest.param("only", "onprem", True, id="only:onprem-ok"),
    pytest.param("only", "on_demand", False, id="only:on_demand-excluded"),
    pytest.param("only", "spot", True, id="only:spot-ok"),
]


@pytest.mark.parametrize(("spot", "market", "ok"), SPOT_CASES)
def test_spot_policy(spot, market, ok):
    p = plan(snap([pool("p", market=market)], pending=[job(1, spot=spot)]))
    if ok:
        assert placed(p) == {1: ("p", {"p-0": 1})}
    else:
        assert p.placements == ()
        assert NO_POOL in waiting(p)[1]


@pytest.mark.parametrize(
    ("spot", "expect"),
    [
        pytest.param("never", "od", id="never->on_demand"),
        pytest.param("only", "sp", id="only->spot"),
        pytest.param("allowed", "sp", id="allowed->cheaper-spot"),
    ],
)
def test_spot_policy_picks_among_rented_pools(spot, expect):
    pools = [pool("od", market="on_demand", price=3.0), pool("sp", market="spot", price=1.0)]
    p = plan(snap(pools, pending=[job(1, spot=spot)]))
    assert placed_pools(p) == {1: expect}


PARTITION_CASES = [
    pytest.param("b", {"b"}, True, id="member-admitted"),
    pytest.param("a", {"b"}, False, id="outsider-refused"),
    pytest.param("a", {"a", "b"}, True, id="one-of-several"),
    pytest.param("a", set(), False, id="empty-set-admits-nobody"),
    pytest.param("a", None, True, id="no-partition-admits-all"),
]


@pytest.mark.parametrize(("who", "teams", "ok"), PARTITION_CASES)
def test_partition(who, teams, ok):
    p = plan(snap([pool("p", teams=teams)], pending=[job(1, team=who)]))
    assert (placed_pools(p) == {1: "p"}) is ok
    if not ok:
        assert NO_POOL in waiting(p)[1]


def test_partition_sends_outsiders_elsewhere():
    pools = [pool("mine", teams={"b"}), pool("shared", price=5.0)]
    p = plan(snap(pools, pending=[job(1, team="a"), job(2, team="b")]))
    assert placed_pools(p) == {1: "shared", 2: "mine"}


# -- which pool, which nodes ----------------------------------------------------------------

CHOICE_CASES = [
    pytest.param(
        [pool("rent", market="on_demand", price=0.0), pool("home", price=9.0)], job(1, gpus=4),
        ("home", {"home-0": 4}), id="onprem-before-rented",
    ),
    pytest.param(
        [pool("dear", price=3.0), pool("cheap", price=1.0)], job(1, gpus=4),
        ("cheap", {"cheap-0": 4}), id="cheapest-pool",
    ),
    pytest.param(
        [pool("big", gpus=8), pool("small", gpus=4)], job(1, gpus=4),
        ("small", {"small-0": 4}), id="smallest-node-size-that-fits",
    ),
    pytest.param(
        [pool("big", gpus=8), pool("small", gpus=4)], job(1, gpus=6),
        ("big", {"big-0": 6}), id="too-small-nodes-skipped",
    ),
    pytest.param(
        [pool("b"), pool("a")], job(1, gpus=4), ("a", {"a-0": 4}), id="tie:pool-name",
    ),
]


@pytest.mark.parametrize(("pools", "j", "expect"), CHOICE_CASES)
def test_pool_choice(pools, j, expect):
    assert placed(plan(snap(pools, pending=[j]))) == {1: expect}


@pytest.mark.parametrize(
    ("gpus", "expect"),
    [
        pytest.param(2, {"a-1": 2}, id="fullest-node-that-fits"),
        pytest.param(3, {"a-2": 3}, id="skips-nodes-too-full"),
        pytest.param(8, {"a-3": 8}, id="empty-node-last"),
    ],
)
def test_best_fit_nodes(gpus, expect):
    # free GPUs: a-0: 1, a-1: 2, a-2: 5, a-3: 8
    busy = [running(1, 1, prio="urgent", alloc={"a-0": 7}),
            running(2, 2, prio="urgent", alloc={"a-1": 6}),
            running(3, 3, prio="urgent", alloc={"a-2": 3})]
    p = plan(snap([pool("a", nodes=4)], running=busy, pending=[job(9, gpus=gpus)]))
    assert placed(p) == {9: ("a", expect)}


def test_jobs_share_a_node_and_never_overcommit():
    p = plan(snap([pool("a", nodes=1)], pending=[job(i, gpus=3, submit=i) for i in range(1, 5)]))
    # 8 GPUs: two 3-GPU jobs fit, the third and fourth wait
    assert placed(p) == {1: ("a", {"a-0": 3}), 2: ("a", {"a-0": 3})}
    assert set(waiting(p)) == {3, 4}


def test_stopping_attempts_still_hold_their_gpus():
    victim = running(1, 1, alloc={"a-0": 8}, stopping=True, stopping_for=None)
    p = plan(snap([pool("a", nodes=1)], running=[victim], pending=[job(2, prio="urgent")]))
    assert p.placements == ()
    assert p.preemptions == ()


# -- shapes no pool can hold ----------------------------------------------------------------

SHAPE_CASES = [
    pytest.param(job(1, gpus=16), id="node-too-small"),
    pytest.param(job(1, gpus=8, nodes=3), id="too-few-nodes"),
    pytest.param(job(1, gpus=4, nodes=2, types=("H100",)), id="right-shape-wrong-type"),
    pytest.param(job(1, gpus=4, types=("H100",), spot="never"), id="right-shape-wrong-market"),
]


@pytest.mark.parametrize("j", SHAPE_CASES)
def test_impossible_shape_waits_with_a_reason(j):
    pools = [pool("a", "A100", nodes=2, gpus=8), pool("h", "H100", nodes=1, market="spot")]
    p = plan(snap(pools, pending=[j, job(2, submit=5, gpus=8, nodes=2)], backfill=False))
    assert waiting(p)[1].startswith(NO_POOL)
    assert 1 not in placed(p)
    assert 1 not in held(p)
    assert p.preemptions == ()
    # it neither blocks the queue (backfill is off) nor uses up the reservation
    assert placed(p) == {2: ("a", {"a-0": 8, "a-1": 8})}


def test_impossible_shape_does_not_use_the_reservation():
    busy = running(1, 1, prio="urgent", alloc={"a-0": 4})
    p = plan(snap([pool("a", nodes=1)], running=[busy],
                  pending=[job(5, gpus=16), job(6, gpus=8, submit=1), job(7, gpus=2, submit=2)]))
    assert NO_POOL in waiting(p)[5]
    assert held(p) == {6: {"a-0": 4}}
    assert p.placements == ()
    assert set(waiting(p)) == {5, 6, 7}


# -- reasons of the jobs the walk never reaches -------------------------------------------
# One FIFO list (class, team, shape) whose jobs differ in the GPU types they accept: each
# unreached job gets its own reason, no pool or its list's.
BEHIND = "behind a blocked job (backfill is off)"
NO_ROOM = "no free GPUs of an acceptable type"
UNREACHED = [job(2, gpus=8, submit=1), job(3, gpus=8, submit=2, types=("H100",)),
             job(4, gpus=8, submit=3, types=("V100", "H100")), job(5, gpus=8, submit=4, types=("A100",))]
UNREACHED_CASES = [
    pytest.param({"backfill": False}, {2: BEHIND, 3: NO_POOL, 4: NO_POOL, 5: BEHIND},
                 id="walk-stopped"),
    pytest.param({"reservations": 0}, {2: NO_ROOM, 3: NO_POOL, 4: NO_POOL, 5: NO_ROOM},
                 id="list-dropped"),
]


@pytest.mark.parametrize(("config", "want"), UNREACHED_CASES)
def test_unreached_jobs_wait_each_with_its_own_reason(config, want):
    busy = running(1, 1, prio="urgent", alloc={"a-0": 8})
    p = plan(snap([pool("a", "A100", nodes=1)], running=[busy],
                  pending=[job(1, gpus=8), *UNREACHED], **config))
    got = waiting(p)
    assert set(got) == {1, 2, 3, 4, 5} and p.placements == ()
    for jid, why in want.items():
        assert got[jid].startswith(why), (jid, got[jid])
    assert [jid for jid, _ in p.waiting] == sorted(jid for jid, _ in p.waiting)

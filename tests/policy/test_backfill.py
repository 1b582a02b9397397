"""Step 4f: reservations for blocked jobs, so backfill cannot starve them.

The first tables are the rule before EASY (easy=False: a reservation holds the free GPUs of
its nodes against every later job), kept as an option; the EASY tables below are the default.
"""

from __future__ import annotations

import dataclasses

import pytest

from broker.policy import PolicyConfig, Snapshot, plan

from .builders import held, job, placed, pool, preempted_for, running, snap, waiting

# a-0: 4 free, a-1: 2 free (normal attempts, which no normal job may preempt).
# Queue: 1 (8 GPUs, blocked), 2 (4 GPUs: fits only a-0), 3 (2 GPUs: fits a-1).
BUSY = [running(1, 11, prio="normal", alloc={"a-0": 4}),
        running(2, 12, prio="normal", alloc={"a-1": 6})]
QUEUE = [job(1, gpus=8, submit=0), job(2, gpus=4, submit=1), job(3, gpus=2, submit=2)]

BACKFILL_CASES = [
    pytest.param(
        {}, {3: ("a", {"a-1": 2})}, {1: {"a-0": 4}}, id="head-holds-a-0:small-job-uses-a-1",
    ),
    pytest.param(
        {"reservations": 0}, {2: ("a", {"a-0": 4}), 3: ("a", {"a-1": 2})}, {},
        id="reservations=0:small-job-takes-the-hole",
    ),
    pytest.param(
        {"reservations": 2}, {}, {1: {"a-0": 4}, 2: {"a-1": 2}},
        id="reservations=2:second-blocked-job-holds-a-1",
    ),
    pytest.param({"backfill": False}, {}, {1: {"a-0": 4}}, id="backfill-off:queue-stops"),
    pytest.param({"backfill": False, "reservations": 0}, {}, {},
                 id="backfill-off-no-reservation:queue-stops"),
]


@pytest.mark.parametrize(("config", "expect", "holds"), BACKFILL_CASES)
def test_backfill_without_starvation(config, expect, holds):
    p = plan(snap([pool("a")], running=BUSY, pending=QUEUE, easy=False, **config))
    assert placed(p) == expect
    assert held(p) == holds
    assert p.preemptions == ()
    assert set(waiting(p)) == {1, 2, 3} - set(expect)
    if config.get("backfill") is False:
        assert waiting(p)[2] == waiting(p)[3] == "behind a blocked job (backfill is off)"


def test_head_reason_names_what_it_holds():
    p = plan(snap([pool("a")], running=BUSY, pending=QUEUE))
    assert waiting(p)[1] == "head of the queue: holding 4 GPUs in a"
    assert waiting(p)[2] == "no free GPUs of an acceptable type"


def test_head_holds_in_the_pool_where_it_is_closest_to_fitting():
    run = [running(1, 11, prio="normal", alloc={"a-0": 4}),
           running(2, 12, prio="normal", alloc={"b-0": 2})]
    pending = [job(1, gpus=8), job(2, gpus=4, submit=1), job(3, gpus=2, submit=2)]
    pools = [pool("a", nodes=1), pool("b", nodes=1, price=1.0)]
    p = plan(snap(pools, running=run, pending=pending))
    assert held(p) == {1: {"b-0": 6}}
    # the 4-GPU job backfills a-0 (outside the reservation); the 2-GPU job has nowhere left
    assert placed(p) == {2: ("a", {"a-0": 4})}
    assert 3 in waiting(p)


def test_gang_head_holds_its_fullest_nodes():
    run = [running(1, 11, prio="normal", alloc={"a-0": 2}),
           running(2, 12, prio="normal", alloc={"a-1": 6}),
           running(3, 13, prio="normal", alloc={"a-2": 4})]
    pending = [job(1, gpus=8, nodes=2), job(2, gpus=2, submit=1), job(3, gpus=6, submit=2)]
    p = plan(snap([pool("a", nodes=3)], running=run, pending=pending))
    assert held(p) == {1: {"a-0": 6, "a-2": 4}}
    assert placed(p) == {2: ("a", {"a-1": 2})}
    assert 3 in waiting(p)


def test_only_the_first_blocked_job_reserves_by_default():
    run = [running(1, 11, prio="normal", alloc={"a-0": 4}),
           running(2, 12, prio="normal", alloc={"b-0": 4})]
    pending = [job(1, gpus=8, types=("A100",)), job(2, gpus=8, types=("H100",), submit=1),
               job(3, gpus=4, submit=2)]
    pools = [pool("a", "A100", nodes=1), pool("b", "H100", nodes=1)]
    p = plan(snap(pools, running=run, pending=pending))
    assert held(p) == {1: {"a-0": 4}}
    assert placed(p) == {3: ("b", {"b-0": 4})}  # job 2 holds nothing: 3 backfills b-0


def test_a_later_job_that_fits_elsewhere_is_not_delayed():
    # the head waits on pool a; pool b (another type) is free for anyone
    run = [running(1, 11, prio="normal", alloc={"a-0": 8})]
    pending = [job(1, gpus=8, types=("A100",)), job(2, gpus=8, submit=1)]
    pools = [pool("a", "A100", nodes=1), pool("b", "H100", nodes=1)]
    p = plan(snap(pools, running=run, pending=pending))
    assert placed(p) == {2: ("b", {"b-0": 8})}


def test_backfill_off_does_not_stop_at_a_job_that_preempts():
    # step 4e only: a job that found victims (4d) is not "still blocked"
    run = [running(1, 11, prio="low", alloc={"a-0": 8})]
    pending = [job(1, prio="high", gpus=8, nodes=2, types=("A100",)),
               job(2, gpus=8, submit=1)]
    pools = [pool("a", "A100"), pool("b", "H100", nodes=1)]
    p = plan(snap(pools, running=run, pending=pending, backfill=False))
    assert preempted_for(p) == [(1, 1)]
    assert held(p) == {1: {"a-1": 8}}
    assert placed(p) == {2: ("b", {"b-0": 8})}


@pytest.mark.parametrize(("config", "held_gpus", "placed_on"), [
    # the product's default: no reservation holds GPUs; job 9 takes the first free ones
    pytest.param({}, {}, ("a", {"a-0": 4}), id="default-holds-nothing"),
    # one EASY reservation: job 1's, on a-0; job 9 has no estimate, so not on a-0
    pytest.param({"reservations": 1}, {1: {"a-0": 4}}, ("b", {"b-0": 4}), id="one-easy-reservation"),
])
def test_product_default_holds_no_gpus_for_blocked_jobs(config, held_gpus, placed_on):
    """PolicyConfig() has no reservations and ages low work after 6 h, every job (chosen with
    the sweep over two capacities of the 60-day trace; see bench/results/sweep.*)."""
    cfg = PolicyConfig()
    assert (cfg.reservations, cfg.easy, cfg.promote_after_s, cfg.promote_gangs_only) == (
        0, True, 21600.0, False)
    pools = [pool(n, nodes=1) for n in "abc"]
    run = [running(i, 10 + i, prio="normal", alloc={f"{n}-0": 4}, end=2000.0 + 100 * i)
           for i, n in enumerate("abc")]
    pending = [job(i + 1, gpus=8, submit=i) for i in range(3)] + [job(9, gpus=4, submit=9)]
    s = Snapshot(now=1000.0, pools=tuple(pools), running=tuple(run), pending=tuple(pending),
                 config=dataclasses.replace(cfg, **config))
    p = plan(s)
    assert held(p) == held_gpus
    assert placed(p) == {9: placed_on}


# -- EASY: a reservation holds GPUs only against jobs that would not end before its start ----
# Pool a, 2 nodes x 8. a-0: a normal job of 4 GPUs expected to end at 2000 (now 1000);
# a-1: one of 6 GPUs expected to end at 6000. Job 1 (8 GPUs) is blocked: a-0 has 8 GPUs at
# 2000, so it reserves a-0 from 2000 and holds a-0's 4 free GPUs. Job 2 asks for 4 GPUs.
def easy_snap(job2_estimate, end0=2000.0, end1=6000.0, **config):  # type: ignore[no-untyped-def]
    run = [running(1, 11, prio="normal", alloc={"a-0": 4}, end=end0),
           running(2, 12, prio="normal", alloc={"a-1": 6}, end=end1)]
    pending = [job(1, gpus=8, submit=0), job(2, gpus=4, submit=1, estimate=job2_estimate),
               job(3, gpus=2, submit=2)]
    return snap([pool("a")], running=run, pending=pending, easy=True, **config)


EASY_CASES = [
    # (holds: what is still held once backfill has used what it may)
    pytest.param(500.0, {}, {2: ("a", {"a-0": 4}), 3: ("a", {"a-1": 2})}, {1: {}},
                 {1: 2000.0}, id="short-job-ends-before-the-start:uses-the-held-gpus"),
    pytest.param(1000.0, {}, {2: ("a", {"a-0": 4}), 3: ("a", {"a-1": 2})}, {1: {}},
                 {1: 2000.0}, id="ending-exactly-at-the-start-is-in-time"),
    pytest.param(1500.0, {}, {3: ("a", {"a-1": 2})}, {1: {"a-0": 4}}, {1: 2000.0},
                 id="longer-job-may-not"),
    pytest.param(None, {}, {3: ("a", {"a-1": 2})}, {1: {"a-0": 4}}, {1: 2000.0},
                 id="no-estimate-may-not"),
    pytest.param(None, {"end0": None, "end1": None}, {2: ("a", {"a-0": 4}), 3: ("a", {"a-1": 2})},
                 {}, {}, id="start-unknown:nothing-held"),
    pytest.param(None, {"end0": 900.0, "end1": None}, {2: ("a", {"a-0": 4}), 3: ("a", {"a-1": 2})},
                 {}, {}, id="an-overrun-estimate-is-unknown:nothing-held"),
    pytest.param(None, {"end0": None}, {2: ("a", {"a-0": 4})}, {1: {"a-1": 2}}, {1: 6000.0},
                 id="reserves-where-the-start-is-known"),
    pytest.param(None, {"reservations": 0}, {2: ("a", {"a-0": 4}), 3: ("a", {"a-1": 2})}, {}, {},
                 id="no-reservations"),
]


@pytest.mark.parametrize(("estimate", "over", "expect", "holds", "starts"), EASY_CASES)
def test_easy_backfill(estimate, over, expect, holds, starts):
    ends = {k: over.pop(k) for k in ("end0", "end1") if k in over}
    p = plan(easy_snap(estimate, **ends, **over))
    assert placed(p) == expect
    assert held(p) == holds
    assert dict(p.starts) == starts
    assert p.preemptions == ()


def test_easy_wakes_when_an_estimate_it_counts_on_would_be_overrun():
    p = plan(easy_snap(None))
    assert p.wake_at == 2000.0  # if job 11 still runs then, job 1's start is unknown
    assert waiting(p)[1].startswith("head of the queue: starts in about 17m in a")


def test_easy_gang_start_is_its_last_node():
    # job 1 needs 2 x 8: a-0 frees at 2000, a-1 at 6000, a-2 never (no estimate)
    run = [running(1, 11, prio="normal", alloc={"a-0": 8}, end=2000.0),
           running(2, 12, prio="normal", alloc={"a-1": 8}, end=6000.0),
           running(3, 13, prio="normal", alloc={"a-2": 8})]
    p = plan(snap([pool("a", nodes=3)], running=run, pending=[job(1, gpus=8, nodes=2)], easy=True))
    assert dict(p.starts) == {1: 6000.0}
    assert held(p) == {1: {}}  # nothing is free now: the two nodes' jobs release all 16 GPUs


# -- preemptible backfill: a lower class may use held GPUs; the reserved job preempts it then --
PREEMPTIBLE_CASES = [
    # job 1 (normal, 8 GPUs) reserves a-0 from T; job 2 (low, 4 GPUs, no estimate) may use the
    # held GPUs when T is at least its checkpoint interval (1800 s) away
    pytest.param("low", 4000.0, {}, {2: ("a", {"a-0": 4})}, id="lower-class-far-start:uses-them"),
    pytest.param("low", 2000.0, {}, {}, id="lower-class-near-start:may-not"),
    pytest.param("normal", 4000.0, {}, {}, id="same-class:may-not"),
    pytest.param("low", 4000.0, {"preemptible_backfill": False}, {}, id="switched-off"),
    pytest.param("low", 4000.0, {"preemption": False}, {}, id="no-preemption:may-not"),
]


@pytest.mark.parametrize(("prio", "end0", "over", "expect"), PREEMPTIBLE_CASES)
def test_preemptible_backfill(prio, end0, over, expect):
    run = [running(1, 11, prio="normal", alloc={"a-0": 4}, end=end0),
           running(2, 12, prio="normal", alloc={"a-1": 8}, end=9000.0)]
    pending = [job(1, gpus=8, submit=0), job(2, prio=prio, gpus=4, submit=1)]
    p = plan(snap([pool("a")], running=run, pending=pending, easy=True, **over))
    assert placed(p) == expect
    assert dict(p.starts) == {1: end0}


@pytest.mark.parametrize(("nodes", "reserved"), [(1, False), (2, True)],
                         ids=["single-node:no-reservation", "gang:reserves"])
def test_reservations_for_gangs_only(nodes, reserved):
    run = [running(1, 11, prio="normal", alloc={"a-0": 4}, end=2000.0),
           running(2, 12, prio="normal", alloc={"a-1": 4}, end=3000.0)]
    p = plan(snap([pool("a")], running=run, pending=[job(1, gpus=8, nodes=nodes)], easy=True,
                  reserve_gangs_only=True))
    assert bool(p.starts) is reserved

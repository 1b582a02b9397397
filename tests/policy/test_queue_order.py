"""Step 3: queue order is class, then fair share (usage / weight), then submit time, then id.

Every job fits, so plan.placements lists the jobs in queue order; the contention cases check
that the order decides who gets the last free GPU.
"""

from __future__ import annotations

import pytest

from broker.policy import plan
from broker.spec import Priority

from .builders import job, placed, placed_order, pool, running, snap, team, waiting

ORDER_CASES = [
    pytest.param(
        [job(1, prio="low"), job(2, prio="normal"), job(3, prio="high"), job(4, prio="urgent")],
        [], {}, [4, 3, 2, 1], id="class:urgent>high>normal>low",
    ),
    pytest.param(
        [job(1, prio="normal", submit=0), job(2, prio="high", submit=50)],
        [], {}, [2, 1], id="class-beats-submit-time",
    ),
    pytest.param(
        [job(1, team="a", prio="normal"), job(2, team="b", prio="high")],
        [team("a", usage=0), team("b", usage=1e9)], {}, [2, 1], id="class-beats-fair-share",
    ),
    pytest.param(
        [job(1, team="a", submit=0), job(2, team="b", submit=10)],
        [team("a", usage=500), team("b", usage=100)], {}, [2, 1], id="lighter-team-first",
    ),
    pytest.param(
        # a: 300 / 1 = 300, b: 400 / 2 = 200 -> b is lighter despite more raw usage
        [job(1, team="a", submit=0), job(2, team="b", submit=10)],
        [team("a", usage=300), team("b", usage=400, weight=2)], {}, [2, 1],
        id="weight-divides-usage",
    ),
    pytest.param(
        # a: 300 / 3 = 100, b: 200 / 1 = 200 -> a is lighter
        [job(1, team="b", submit=0), job(2, team="a", submit=10)],
        [team("a", usage=300, weight=3), team("b", usage=200)], {}, [2, 1],
        id="weight-favours-heavier-weighted-team",
    ),
    pytest.param(
        [job(1, team="a", submit=0), job(2, team="b", submit=10)],
        [team("a", usage=500), team("b", usage=100)], {"fair_share": False}, [1, 2],
        id="fair_share-off:submit-time",
    ),
    pytest.param(
        [job(1, team="a", submit=20), job(2, team="a", submit=10), job(3, team="a", submit=30)],
        [], {}, [2, 1, 3], id="same-team:older-first",
    ),
    pytest.param(
        [job(7, submit=5), job(3, submit=5), job(5, submit=5)],
        [], {}, [3, 5, 7], id="full-tie:job-id",
    ),
    pytest.param(
        [job(1, team="a", submit=0), job(2, team="zzz", submit=10)],
        [team("a", usage=10)], {}, [2, 1], id="unknown-team-has-no-usage",
    ),
    pytest.param(
        [job(1, prio="low", submit=0), job(2, prio="urgent", submit=10), job(3, submit=5)],
        [], {"classes": False}, [1, 3, 2], id="classes-off:plain-fifo",
    ),
    pytest.param(
        [job(2, team="a", prio="high", submit=9), job(1, team="b", prio="low", submit=0),
         job(4, team="b", prio="high", submit=1), job(3, team="a", prio="low", submit=3)],
        [team("a", usage=10), team("b", usage=20)], {}, [2, 4, 3, 1],
        id="class-then-share-mixed",
    ),
]


@pytest.mark.parametrize(("pending", "teams", "config", "order"), ORDER_CASES)
def test_queue_order(pending, teams, config, order):
    s = snap([pool("a", nodes=1, gpus=8)], pending=pending, teams=teams, **config)
    p = plan(s)
    assert placed_order(p) == order
    assert p.preemptions == ()
    assert p.waiting == ()


CONTENTION_CASES = [
    pytest.param([job(1, prio="normal"), job(2, prio="high", submit=9)], [], 2, id="class"),
    pytest.param(
        [job(1, team="a"), job(2, team="b", submit=9)],
        [team("a", usage=50), team("b", usage=10)], 2, id="fair-share",
    ),
    pytest.param(
        [job(1, team="a"), job(2, team="b", submit=9)],
        [team("a", usage=50), team("b", usage=10, weight=0.1)], 1, id="low-weight-is-heavier",
    ),
    pytest.param([job(1, submit=9), job(2, submit=3)], [], 2, id="submit-time"),
    pytest.param([job(9, submit=3), job(4, submit=3)], [], 4, id="job-id"),
]


@pytest.mark.parametrize(("pending", "teams", "winner"), CONTENTION_CASES)
def test_queue_order_decides_the_last_free_gpu(pending, teams, winner):
    # a-0 has one free GPU; the other 7 are held by an urgent job nobody can preempt.
    busy = running(100, 100, prio="urgent", alloc={"a-0": 7})
    p = plan(snap([pool("a", nodes=1)], running=[busy], pending=pending, teams=teams))
    assert placed(p) == {winner: ("a", {"a-0": 1})}
    loser = ({j.job_id for j in pending} - {winner}).pop()
    assert loser in waiting(p)
    assert p.preemptions == ()


def test_placement_carries_the_class():
    p = plan(snap(pending=[job(1, prio="urgent"), job(2, prio="low")]))
    assert [(pl.job_id, pl.priority) for pl in p.placements] == [
        (1, Priority.URGENT), (2, Priority.LOW)]


# Aging: NOW is 1000; a job submitted at or before NOW - promote_after_s moves one class up.
AGING = [
    # (job 1 low gang submitted at t, job 2 normal single submitted at 500, gangs_only, first)
    pytest.param(0.0, True, [1, 2], id="old-low-gang-promoted-ahead-of-newer-normal"),
    pytest.param(600.0, True, [2, 1], id="not-waited-long-enough"),
    pytest.param(0.0, False, [1, 2], id="all-jobs-aging"),
]


@pytest.mark.parametrize(("submit", "gangs_only", "order"), AGING)
def test_aging_promotes_one_class(submit, gangs_only, order):
    s = snap([pool("a", nodes=4)],
             pending=[job(1, prio="low", gpus=8, nodes=2, submit=submit),
                      job(2, prio="normal", gpus=8, submit=500)],
             promote_after_s=900, promote_gangs_only=gangs_only)
    assert placed_order(plan(s)) == order


# Aging lifts low work to normal and nothing into high or urgent (an aged job would spend its
# team's priority allowance and outrank high work). One node; both jobs fit it alone.
NEVER_INTO_HIGH = [
    # (old job's class, new job's class, placed)
    pytest.param("normal", "high", [2], id="old-normal-stays-behind-new-high"),
    pytest.param("high", "urgent", [2], id="old-high-stays-behind-new-urgent"),
    pytest.param("low", "normal", [1], id="old-low-goes-ahead-of-new-normal"),
]


@pytest.mark.parametrize(("old", "new", "placed"), NEVER_INTO_HIGH)
def test_aging_lifts_low_work_to_normal_only(old, new, placed):
    s = snap([pool("a", nodes=1)],
             pending=[job(1, prio=old, gpus=8, submit=0), job(2, prio=new, gpus=8, submit=900)],
             promote_after_s=100, promote_gangs_only=False)
    assert placed_order(plan(s)) == placed


# An attempt that started aged keeps its aged class as a victim: a normal job does not preempt
# low work that was aged to normal when it started (else it would be preempted back at once:
# requeued, its age still counts from submission). Pending: job 1, a normal gang of 2x8
# submitted at 0 (NOW=1000, promote_after_s=900: normal work does not age).
AGED_VICTIMS = [
    # (running low attempts as (submit, start, nodes they span), gangs_only, preempted)
    pytest.param([(0.0, 950.0, 2)], True, set(), id="gang-aged-when-it-started-is-no-victim"),
    pytest.param([(500.0, 950.0, 2)], True, {10}, id="gang-not-aged-when-it-started-is-a-victim"),
    pytest.param([(0.0, 950.0, 1), (0.0, 950.0, 1)], False, set(),
                 id="aged-single-node-attempts-are-no-victims-when-every-job-ages"),
    pytest.param([(0.0, 950.0, 1), (0.0, 950.0, 1)], True, {10, 11},
                 id="single-node-attempts-do-not-age-when-only-gangs-do"),
]


@pytest.mark.parametrize(("attempts", "gangs_only", "victims"), AGED_VICTIMS)
def test_an_aged_job_does_not_preempt_work_aged_when_it_started(attempts, gangs_only, victims):
    run, i = [], 0
    for k, (sub, start, span) in enumerate(attempts):
        alloc = {f"a-{i + n}": 8 for n in range(span)}
        i += span
        run.append(running(10 + k, 110 + k, prio="low", alloc=alloc, started=start, submit=sub))
    s = snap([pool("a", nodes=2)], running=run,
             pending=[job(1, prio="normal", gpus=8, nodes=2, submit=0)],
             promote_after_s=900, promote_gangs_only=gangs_only)
    assert {pre.attempt_id for pre in plan(s).preemptions} == victims


# Aging orders the queue; it grants no right to preempt. Running: two low attempts filling
# both nodes. Pending: job 1, a gang of 2x8 submitted at 0, aged one class at NOW=1000.
AGED_PREEMPTS = [
    # (class of job 1, preempted): a low job aged to normal preempts no low work (it would
    # trade one low job for another, losing work); a normal one preempts low work as ever
    pytest.param("low", set(), id="aged-low-preempts-no-low-work"),
    pytest.param("normal", {10, 11}, id="normal-preempts-low-work-aged-or-not"),
]


@pytest.mark.parametrize(("prio", "victims"), AGED_PREEMPTS)
def test_an_aged_job_preempts_only_below_its_own_class(prio, victims):
    s = snap([pool("a", nodes=2)],
             running=[running(10, 110, prio="low", alloc={"a-0": 8}),
                      running(11, 111, prio="low", alloc={"a-1": 8})],
             pending=[job(1, prio=prio, gpus=8, nodes=2, submit=0)],
             promote_after_s=900)
    p = plan(s)
    assert {pre.attempt_id for pre in p.preemptions} == victims


# When a waiting job's aging comes due, a new plan can differ only where queue order alone
# decides: who gets a reservation, or where the walk stops without backfill. One node, full
# with high work; a low job of 1 GPU submitted at 500 ages at 1400 (NOW 1000).
AGING_WAKE = [
    pytest.param({"reservations": 0}, None, id="no-reservations:nothing-to-wake-for"),
    pytest.param({"reservations": 1}, 1400.0, id="a-reservation-may-change-hands"),
    pytest.param({"backfill": False}, 1400.0, id="without-backfill-the-walk-may-stop-elsewhere"),
]


@pytest.mark.parametrize(("config", "wake"), AGING_WAKE)
def test_aging_wakes_the_planner_only_when_order_can_change_the_plan(config, wake):
    s = snap([pool("a", nodes=1)], running=[running(10, 110, prio="high", alloc={"a-0": 8})],
             pending=[job(1, prio="low", gpus=1, submit=500)],
             promote_after_s=900, promote_gangs_only=False, **config)
    assert plan(s).wake_at == wake


# Oldest gangs first: within its class, a gang that has waited promote_after_s (900 here; NOW
# 1000) comes before every team's share, oldest first; without it, a heavier team's gang is
# behind lighter teams' work whenever whole nodes free up. Two free nodes of 8 GPUs; team h
# is far heavier than l and has no priority allowance (its high work is demoted to normal).
H, L = team("h", usage=1e6, allowance=0), team("l", usage=0.0)
OLD_GANG = job(1, team="h", prio="normal", gpus=8, nodes=2, submit=0)
FRESH_SMALL = job(2, team="l", prio="normal", gpus=1, submit=900)
GANGS_FIRST = [
    # (pending, config, placed with the rule, placed without it)
    pytest.param([OLD_GANG, FRESH_SMALL], {}, {1}, {2}, id="waited-gang-of-heavier-team-first"),
    pytest.param([job(1, team="h", prio="normal", gpus=8, nodes=2, submit=500), FRESH_SMALL],
                 {}, {2}, {2}, id="gang-that-waited-less-keeps-fair-share-order"),
    pytest.param([job(1, team="h", prio="normal", gpus=8, submit=0),
                  job(3, team="h", prio="normal", gpus=8, submit=0),
                  job(2, team="l", prio="normal", gpus=8, submit=900)],
                 {}, {1, 2}, {1, 2}, id="single-node-jobs-keep-fair-share-order"),
    pytest.param([job(1, team="l", prio="normal", gpus=8, nodes=2, submit=0),
                  job(3, team="h", prio="normal", gpus=8, nodes=2, submit=50)],
                 {}, {1}, {1}, id="lighter-and-older-gang-first"),
    pytest.param([job(3, team="l", prio="normal", gpus=8, nodes=2, submit=50),
                  job(1, team="h", prio="normal", gpus=8, nodes=2, submit=0)],
                 {}, {1}, {3}, id="older-gang-of-heavier-team-first"),
    pytest.param([OLD_GANG, job(2, team="l", prio="high", gpus=1, submit=900)],
                 {}, {2}, {2}, id="class-still-comes-first"),
    pytest.param([job(1, team="h", prio="low", gpus=8, nodes=2, submit=0), FRESH_SMALL],
                 {}, {1}, {2}, id="aged-low-gang-first-at-normal"),
    pytest.param([job(1, team="h", prio="high", gpus=8, nodes=2, submit=0), FRESH_SMALL],
                 {}, {1}, {2}, id="gang-demoted-by-anti-capture-first-at-normal"),
    pytest.param([OLD_GANG, FRESH_SMALL], {"promote_after_s": None}, {2}, {2},
                 id="aging-off-fair-share-only"),
]


@pytest.mark.parametrize(("pending", "config", "first", "without"), GANGS_FIRST)
def test_gangs_that_waited_go_first_in_their_class(pending, config, first, without):
    for rule, want in ((True, first), (False, without)):
        s = snap([pool("a", nodes=2)], pending=pending, teams=[H, L], oldest_gangs_first=rule,
                 promote_gangs_only=False, **{"promote_after_s": 900, **config})
        assert set(placed(plan(s))) == want, rule


@pytest.mark.parametrize(("rule", "wake"), [
    pytest.param(True, 1400.0, id="a-gang-going-first-may-take-the-reservation"),
    pytest.param(False, None, id="normal-work-does-not-age"),
])
def test_a_gang_going_first_wakes_the_planner_when_order_can_change_the_plan(rule, wake):
    s = snap([pool("a", nodes=2)], running=[running(10, 110, prio="high", alloc={"a-0": 8})],
             pending=[job(1, prio="normal", gpus=8, nodes=2, submit=500)],
             promote_after_s=900, oldest_gangs_first=rule, reservations=1, preempt_after_s=0)
    assert plan(s).wake_at == wake

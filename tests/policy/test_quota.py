"""broker.policy.quota: quotas with borrowing and reclaim (issue 28 part 1), one table.

Rows marked "Kueue" are derived from Kueue's documented cohort semantics and the cases of
kubernetes-sigs/kueue pkg/scheduler/preemption/preemption_test.go (TestPreemption) and its
KEPs (1224 lendingLimit, 1337 borrowWithinCohort); onepool's lab is one cohort, a team one
ClusterQueue with reclaimWithinCohort: Any, borrowWithinCohort: LowerPriority and
withinClusterQueue: Never (work within a quota is never a victim by class). Others are ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.policy import TeamView, plan
from broker.policy.quota import QuotaBook
from broker.policy.snapshot import RunningView, TeamQuota

from .builders import job, placed, pool, running, snap, waiting


def quota(gpus: int | dict[str, int], borrow: int | None = None, lend: int | None = None) -> TeamQuota:
    nominal = tuple(gpus.items()) if isinstance(gpus, dict) else (("*", gpus),)
    return TeamQuota(nominal, borrow, lend)


def teams(**quotas: TeamQuota | None) -> list[TeamView]:
    return [TeamView(name, quota=q) for name, q in quotas.items()]


@dataclass
class Case:
    pools: list[Any]
    quotas: dict[str, TeamQuota | None]
    run: list[RunningView]
    pending: list[Any]
    victims: list[int] = field(default_factory=list)  # job ids preempted
    placed: list[int] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)  # job id -> part of its waiting reason


def r(aid: int, team: str, prio: str, alloc: dict[str, int], started: float = 0.0, **kw: Any) -> RunningView:
    return running(aid, 100 + aid, team=team, prio=prio, alloc=alloc, started=started, **kw)


CASES = [
    pytest.param(Case(
        # Kueue "reclaim quota from borrower": c1 and c2 have 6 each; c2 runs high 6 (within)
        # and mid 3 (borrowed); c1 (low 3) sends high 3: c2-mid is reclaimed, not c1's own low
        [pool("a", nodes=1, gpus=12)], {"c1": quota(6), "c2": quota(6)},
        [r(1, "c1", "low", {"a-0": 3}), r(2, "c2", "normal", {"a-0": 3}), r(3, "c2", "high", {"a-0": 6})],
        [job(9, team="c1", prio="high", gpus=3)], victims=[102]),
        id="kueue:reclaim-quota-from-borrower"),
    pytest.param(Case(
        # Kueue "no workloads borrowing": both teams within their nominal; c1's next high job
        # would borrow, and nothing guaranteed is a victim by class
        [pool("a", nodes=1, gpus=8)], {"c1": quota(4), "c2": quota(4)},
        [r(1, "c1", "high", {"a-0": 4}), r(2, "c2", "low", {"a-0": 4})],
        [job(9, team="c1", prio="high", gpus=4)], why={9: "no free GPUs"}),
        id="kueue:no-workloads-borrowing"),
    pytest.param(Case(
        # Kueue "not enough workloads borrowing" with borrowWithinCohort: LowerPriority (KEP-1337):
        # c1 would borrow, so it reclaims nothing, but preempts c2's borrowed low by class
        [pool("a", nodes=1, gpus=12)], {"c1": quota(6), "c2": quota(6)},
        [r(1, "c1", "high", {"a-0": 4}), r(2, "c2", "low", {"a-0": 4}),
         r(3, "c2", "low", {"a-0": 4}, started=10)],
        [job(9, team="c1", prio="high", gpus=4)], victims=[103]),
        id="kueue:borrowing-job-preempts-only-borrowed-lower-class"),
    pytest.param(Case(
        # Kueue reclaimWithinCohort: Any: a low job within its quota reclaims even urgent
        # borrowed work of another team
        [pool("a", nodes=1, gpus=8)], {"a": quota(8), "b": None},
        [r(1, "b", "urgent", {"a-0": 8})],
        [job(9, team="a", prio="low", gpus=8)], victims=[101]),
        id="kueue:reclaim-any-class"),
    pytest.param(Case(
        # Kueue borrowingLimit: b (2 nominal, may borrow 2) cannot take 6 GPUs, can take 4
        [pool("a", nodes=1, gpus=8)], {"a": quota(6), "b": quota(2, borrow=2)}, [],
        [job(9, team="b", gpus=6)], why={9: "borrowing limit"}),
        id="kueue:borrowing-limit-refuses"),
    pytest.param(Case(
        [pool("a", nodes=1, gpus=8)], {"a": quota(6), "b": quota(2, borrow=2)}, [],
        [job(9, team="b", gpus=4)], placed=[9]),
        id="kueue:within-borrowing-limit"),
    pytest.param(Case(
        # Kueue lendingLimit (KEP-1224): a lends at most 2 of its idle 6; b (2) may use 4, not 6
        [pool("a", nodes=1, gpus=8)], {"a": quota(6, lend=2), "b": quota(2)}, [],
        [job(9, team="b", gpus=6)], why={9: "lending limits"}),
        id="kueue:lending-limit-refuses"),
    pytest.param(Case(
        [pool("a", nodes=1, gpus=8)], {"a": quota(6, lend=2), "b": quota(2)}, [],
        [job(9, team="b", gpus=4)], placed=[9]),
        id="kueue:within-lending-limit"),
    pytest.param(Case(
        # ours: capacity nobody claims is lent, never idle: a team without a quota borrows all
        [pool("a", nodes=2, gpus=8)], {"a": quota(16), "b": None}, [],
        [job(9, team="b", prio="low", gpus=8, nodes=2)], placed=[9]),
        id="idle-quota-is-lent"),
    pytest.param(Case(
        # ours: within-quota work is never a victim by class, urgent included
        [pool("a", nodes=1, gpus=8)], {"a": quota(8), "b": None},
        [r(1, "a", "low", {"a-0": 8})],
        [job(9, team="b", prio="urgent", gpus=8)], why={9: "no free GPUs"}),
        id="within-quota-protected-from-urgent"),
    pytest.param(Case(
        # ours: reclaim takes the fewest borrowed victims, then the least work lost
        [pool("a", nodes=2, gpus=8)], {"a": quota(8), "b": None},
        [r(1, "b", "low", {"a-0": 4}, started=990), r(2, "b", "low", {"a-0": 4}, started=990),
         r(3, "b", "normal", {"a-1": 8}, started=500, ckpt=995)],
        [job(9, team="a", gpus=8)], victims=[103]),
        id="reclaim-fewest-then-least-lost"),
    pytest.param(Case(
        # issue 28 part 4 as a reclaim: b's 11 and 12 span a-0/a-1, 13 fills a-2 and has little
        # to lose; a's 2x8 gang within its quota reclaims 11 and 12 only
        [pool("a", nodes=3, gpus=8)], {"a": quota(16), "b": None},
        [r(1, "b", "low", {"a-0": 4, "a-1": 4}), r(2, "b", "low", {"a-0": 4, "a-1": 4}),
         r(3, "b", "low", {"a-2": 8}, started=999)],
        [job(9, team="a", gpus=8, nodes=2)], victims=[101, 102]),
        id="gang-reclaim-fewest-victims"),
    pytest.param(Case(
        # ours: a victim preempted before keeps its minimum run time against reclaim too
        [pool("a", nodes=1, gpus=8)], {"a": quota(8), "b": None},
        [r(1, "b", "low", {"a-0": 8}, started=990, preempted=1)],
        [job(9, team="a", gpus=8)], why={9: "no free GPUs"}),
        id="reclaim-respects-min-run"),
    pytest.param(Case(
        # ours: the first job's reclaim uses a's quota; the second would borrow, and b's
        # borrowed work is not of a lower class: one victim, not two
        [pool("a", nodes=2, gpus=8)], {"a": quota(8), "b": None},
        [r(1, "b", "normal", {"a-0": 8}), r(2, "b", "normal", {"a-1": 8})],
        [job(9, team="a", gpus=8), job(10, team="a", gpus=8)], victims=[101]),
        id="quota-charged-within-the-plan"),
    pytest.param(Case(
        # ours: a reclaim in progress keeps its quota across cycles: b's attempt is stopping for
        # a's job 9, so a's job 10 would borrow and reclaims nothing (else the two would take 16
        # of a's 8, and b would reclaim back: thrash)
        [pool("a", nodes=2, gpus=8)], {"a": quota(8), "b": None},
        [r(1, "b", "normal", {"a-0": 8}, stopping=True, stopping_for=9), r(2, "b", "normal", {"a-1": 8})],
        [job(9, team="a", gpus=8), job(10, team="a", gpus=8)], why={10: "no free GPUs"}),
        id="reclaim-in-progress-keeps-its-quota"),
    pytest.param(Case(
        # Kueue admits what fits without borrowing before what borrows: a's low job within its
        # quota takes the free node before b's high job, which would borrow (else GPUs a
        # reclaimed would go, once its victims exit, to borrowing work ahead in the queue)
        [pool("a", nodes=1, gpus=8)], {"a": quota(8), "b": None}, [],
        [job(9, team="a", prio="low", gpus=8), job(10, team="b", prio="high", gpus=8)], placed=[9]),
        id="kueue:within-quota-goes-first"),
    pytest.param(Case(
        # ours: a team's own work past its quota is borrowed, its oldest highest-class first
        # within: a's new high job reclaims nothing (a would borrow) and its own low is guarded
        [pool("a", nodes=1, gpus=8)], {"a": quota(8)},
        [r(1, "a", "low", {"a-0": 8})],
        [job(9, team="a", prio="high", gpus=8)], why={9: "no free GPUs"}),
        id="own-team-past-quota-waits"),
    pytest.param(Case(
        # ours: per GPU type: a's A100 quota reclaims on A100 only; its H100 job borrows
        [pool("x", "A100", nodes=1), pool("y", "H100", nodes=1)],
        {"a": quota({"A100": 8}), "b": None},
        [r(1, "b", "normal", {"x-0": 8}), r(2, "b", "normal", {"y-0": 8})],
        [job(9, team="a", gpus=8, types=["A100"]), job(10, team="a", gpus=8, types=["H100"])],
        victims=[101], why={10: "no free GPUs"}),
        id="per-type-quota"),
]


@pytest.mark.parametrize("c", CASES)
def test_quota_rules(c: Case) -> None:
    p = plan(snap(c.pools, running=c.run, pending=c.pending, teams=teams(**c.quotas), reservations=0))
    assert sorted(pe.job_id for pe in p.preemptions) == c.victims
    assert sorted(placed(p)) == c.placed
    why = waiting(p)
    for jid, part in c.why.items():
        assert part in why.get(jid, ""), f"job {jid}: {why.get(jid)!r}"


BOOK_CASES = [
    # (nominal, running GPUs oldest first with class, borrowed attempt ids)
    pytest.param(8, [("low", 4), ("low", 4), ("low", 4)], [3], id="prefix-oldest-first"),
    pytest.param(8, [("low", 4), ("high", 8)], [1], id="higher-class-first"),
    pytest.param(6, [("low", 4), ("low", 4)], [2], id="straddling-attempt-borrowed"),
    pytest.param(0, [("urgent", 1)], [1], id="no-quota-all-borrowed"),
]


@pytest.mark.parametrize(("nominal", "held", "borrowed"), BOOK_CASES)
def test_within_or_borrowed(nominal: int, held: list[tuple[str, int]], borrowed: list[int]) -> None:
    run = [r(i + 1, "a", prio, {"a-0": g}, started=float(i)) for i, (prio, g) in enumerate(held)]
    book = QuotaBook(teams(a=quota(nominal)), [pool("a", nodes=1, gpus=64)], run)
    assert sorted(book.borrowed) == borrowed
    assert book.within == {x.attempt_id for x in run} - set(borrowed)

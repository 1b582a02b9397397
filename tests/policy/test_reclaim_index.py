"""ReclaimIndex, the running attempts indexed for preemption that a caller keeps across cycles
(the simulator does): kept through several cycles of attempts starting, being signalled and
ending, it must give plan() exactly the plan plan() makes from `running` alone (the live
engine's way), and hold what a fresh index would.

Table-driven: each case is a list of cycles built with the shared builders; between cycles
the test updates one index the way a caller does (remove the attempts that ended, update
the ones whose view changed, add the ones that started).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.policy import RunningView, Snapshot, plan
from broker.policy.reclaim_index import ReclaimIndex

from .builders import job, pool, running, snap, team


def fresh(s: Snapshot) -> ReclaimIndex:
    cfg = s.config
    return ReclaimIndex(s.running, cfg.promote_after_s if cfg.classes else None,
                        cfg.promote_gangs_only)


def follow(ix: ReclaimIndex, before: tuple[RunningView, ...], s: Snapshot) -> None:
    """Bring a kept index from the attempts `before` to the snapshot's."""
    old = {r.attempt_id: r for r in before}
    new = {r.attempt_id: r for r in s.running}
    for aid, r in old.items():
        if aid not in new:
            ix.remove(r)
        elif new[aid] != r:
            ix.update(r, new[aid])
    for aid, r in new.items():
        if aid not in old:
            ix.add(r)


A = pool("a", nodes=3)
A2 = pool("a", nodes=2)
B = pool("b", nodes=2, gpu_type="V100")
B1 = pool("b", nodes=1, gpu_type="V100")
PREEMPT = dict(preempt_after_s=0, checkpoint_align_s=0, min_run_s=600)
LOW_AGED = running(1, 11, prio="low", alloc={"a-0": 8}, started=500, submit=0)  # waited 500 s
LOW = running(2, 12, prio="low", alloc={"a-1": 4}, started=900, ckpt=950)
WIDE = running(3, 13, prio="low", alloc={"a-1": 4, "a-2": 8}, started=700, submit=0)
HIGH = running(4, 14, team="h", prio="high", alloc={"b-0": 8}, started=100)
HIGH2 = running(5, 15, team="h", prio="high", alloc={"b-1": 8}, started=200)
RESTARTED = running(6, 16, prio="low", alloc={"a-2": 8}, started=800, preempted=1)

CASES = [
    pytest.param([
        snap([A2], [LOW_AGED, LOW], [job(1, prio="normal", gpus=8, submit=999)],
             promote_after_s=400, promote_gangs_only=False, **PREEMPT),
        snap([A2], [LOW_AGED, replace(LOW, stopping=True, stopping_for=1)],
             [job(1, prio="normal", gpus=8, submit=999), job(2, prio="normal", gpus=4)],
             promote_after_s=400, promote_gangs_only=False, **PREEMPT),
        snap([A2], [LOW_AGED, running(7, 1, prio="normal", alloc={"a-1": 8}, started=1000)],
             [job(2, prio="high", gpus=8)],
             promote_after_s=400, promote_gangs_only=False, **PREEMPT),
    ], id="aged-victim-kept-a-class-higher,victim-stops,ends"),
    pytest.param([
        snap([A], [WIDE, RESTARTED, running(8, 18, prio="low", alloc={"a-0": 2}, started=990)],
             [job(1, prio="high", gpus=8, nodes=2), job(2, prio="normal", gpus=8)],
             promote_after_s=600, **PREEMPT),
        snap([A], [WIDE, RESTARTED], [job(1, prio="high", gpus=8, nodes=2)],
             promote_after_s=600, now=1500, **PREEMPT),
    ], id="gang-victim-aged,min-run-protected-then-not"),
    pytest.param([
        snap([B], [HIGH, HIGH2], [job(1, team="u", prio="urgent", gpus=8),
                                  job(2, team="h", prio="high", gpus=8)],
             [team("h", allowance=8), team("u"), team("x")], **PREEMPT),
        snap([B], [HIGH, replace(HIGH2, stopping=True, stopping_for=1)],
             [job(1, team="u", prio="urgent", gpus=8), job(2, team="h", prio="high", gpus=8),
              job(3, team="u", prio="urgent", gpus=8, types=("V100",))],
             [team("h", allowance=8), team("u"), team("x")], **PREEMPT),
    ], id="anti-capture-demoted-victims"),
    pytest.param([
        snap([A2, B1], [LOW_AGED, LOW, HIGH], [job(1, prio="normal", gpus=8), job(2, gpus=4)],
             victim_order="youngest", min_run_s=0, preempt_after_s=0, promote_after_s=None),
        snap([A2, B1], [LOW, HIGH], [job(3, prio="urgent", gpus=8, nodes=2)],
             victim_order="youngest", min_run_s=0, preempt_after_s=0, promote_after_s=None),
    ], id="youngest-order,no-aging"),
    pytest.param([
        snap([A2], [LOW_AGED, LOW], [job(1, prio="normal", gpus=8)], classes=False, **PREEMPT),
    ], id="classes-off"),
]


@pytest.mark.parametrize("cycles", CASES)
def test_index_kept_across_cycles_plans_like_the_attempts(cycles: list[Snapshot]) -> None:
    kept = fresh(cycles[0])
    before = cycles[0].running
    for s in cycles:
        follow(kept, before, s)
        before = s.running
        want = plan(s)
        assert plan(replace(s, reclaim_index=kept)) == want
        assert plan(replace(s, reclaim_index=fresh(s))) == want
        new = fresh(s)
        assert kept.rank == new.rank and kept.below == new.below and kept.count == new.count
        assert kept.order == new.order and kept.stopping == new.stopping


def test_plans_with_victims_are_covered() -> None:
    """The table exercises the search: a plan of every case with classes preempts."""
    for c in CASES:
        cycles = c.values[0]
        assert any(plan(s).preemptions for s in cycles) or not cycles[0].config.classes, c.id


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: replace(s, running=s.running[:1]), "the snapshot 1 "),
    (lambda s: replace(s, running=(replace(s.running[0], stopping=True), s.running[1])),
     r"\(1 stopping\)"),
    (lambda s: replace(s, config=replace(s.config, promote_after_s=60.0)), "aging parameters"),
])
def test_an_index_that_disagrees_with_the_snapshot_is_refused(change, message):  # type: ignore[no-untyped-def]
    s = snap([A], [LOW_AGED, LOW], [job(1, prio="normal", gpus=8)], **PREEMPT)
    with pytest.raises(ValueError, match=message):
        plan(change(replace(s, reclaim_index=fresh(s))))


def test_index_operations() -> None:
    ix = ReclaimIndex([LOW, LOW_AGED], aged_after=400, gangs_only=False)
    assert [[r.attempt_id for r in rs] for rs in ix.order] == [[2], [1], [], []]
    assert ix.rank == {2: 0, 1: 1} and ix.below["a-0"] == [0, 0, 8, 8, 8]
    with pytest.raises(ValueError):
        ix.add(LOW)
    ix.update(LOW, replace(LOW, stopping=True))
    assert ix.size == 2 and ix.stopping == {2} and "a-1" not in ix.below
    ix.remove(replace(LOW, stopping=True))
    ix.remove(LOW_AGED)
    assert ix.size == 0 and not ix.below and not any(ix.order)

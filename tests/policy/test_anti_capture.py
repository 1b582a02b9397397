"""Step 2: a team's high/urgent GPUs beyond its allowance are scheduled as normal."""

from __future__ import annotations

import pytest

from broker.policy import plan
from broker.spec import Priority

from .builders import job, placed, placed_order, pool, preempted_for, running, snap, team, waiting

# Team a (allowance 8) submits two 8-GPU urgent jobs. a-0 is free; a-1 runs team b's attempt 1.
CAPTURE_CASES = [
    pytest.param(8, "normal", {}, (2,), [], id="second-demoted:cannot-preempt-normal"),
    pytest.param(8, "low", {}, (2,), [(1, 2)], id="second-demoted:still-preempts-low"),
    pytest.param(16, "normal", {}, (), [(1, 2)], id="within-allowance:preempts-normal"),
    pytest.param(8, "normal", {"anti_capture": False}, (), [(1, 2)], id="anti_capture-off"),
    pytest.param(8, "high", {}, (2,), [], id="second-demoted:cannot-preempt-high"),
]


@pytest.mark.parametrize(("allowance", "victim_prio", "config", "demoted", "victims"),
                         CAPTURE_CASES)
def test_urgent_beyond_allowance_is_scheduled_as_normal(
        allowance, victim_prio, config, demoted, victims):
    run = [running(1, 11, team="b", prio=victim_prio, alloc={"a-1": 8})]
    pending = [job(1, team="a", prio="urgent", gpus=8, submit=0),
               job(2, team="a", prio="urgent", gpus=8, submit=1)]
    p = plan(snap([pool("a")], running=run, pending=pending,
                  teams=[team("a", allowance=allowance), team("b")], **config))
    assert placed(p) == {1: ("a", {"a-0": 8})}
    assert p.placements[0].priority is Priority.URGENT
    assert p.demoted == demoted
    assert preempted_for(p) == victims
    assert 2 in waiting(p)


def test_demoted_job_is_placed_as_normal_and_queued_among_normal_jobs():
    pending = [job(1, team="a", prio="urgent", gpus=8, submit=0),
               job(2, team="a", prio="urgent", gpus=8, submit=2),
               job(3, team="b", prio="normal", gpus=8, submit=1),
               job(4, team="b", prio="high", gpus=8, submit=3)]
    p = plan(snap([pool("a", nodes=4)], pending=pending,
                  teams=[team("a", allowance=8), team("b", allowance=8)]))
    assert placed_order(p) == [1, 4, 3, 2]
    assert {pl.job_id: pl.priority for pl in p.placements} == {
        1: Priority.URGENT, 4: Priority.HIGH, 3: Priority.NORMAL, 2: Priority.NORMAL}
    assert p.demoted == (2,)


ALLOWANCE_CASES = [
    pytest.param(
        # the 16-GPU job does not fit the allowance at all; the 4-GPU one after it still does
        8, [job(1, prio="urgent", gpus=8, nodes=2), job(2, prio="urgent", gpus=4, submit=1)],
        (1,), id="too-big-demoted-smaller-keeps-class",
    ),
    pytest.param(
        8, [job(1, prio="high", gpus=4), job(2, prio="urgent", gpus=4, submit=1),
            job(3, prio="high", gpus=1, submit=2)],
        (3,), id="urgent-takes-allowance-first-then-high",
    ),
    pytest.param(0, [job(1, prio="high", gpus=1), job(2, prio="low", gpus=1)], (1,),
                 id="zero-allowance"),
    pytest.param(8, [job(1, prio="high", gpus=4, nodes=2)], (), id="exactly-the-allowance"),
    pytest.param(8, [job(1, prio="normal", gpus=8), job(2, prio="high", gpus=8, submit=1)], (),
                 id="normal-jobs-use-no-allowance"),
]


@pytest.mark.parametrize(("allowance", "pending", "demoted"), ALLOWANCE_CASES)
def test_allowance_is_taken_in_queue_order(allowance, pending, demoted):
    p = plan(snap([pool("a", nodes=4)], pending=pending, teams=[team("a", allowance=allowance)]))
    assert p.demoted == demoted
    asked = {j.job_id: j.priority for j in pending}
    assert {pl.job_id: pl.priority for pl in p.placements} == {
        jid: Priority.NORMAL if jid in demoted else prio for jid, prio in asked.items()}


def test_allowance_is_per_team():
    pending = [job(1, team="a", prio="urgent", gpus=8), job(2, team="a", prio="urgent", gpus=8),
               job(3, team="b", prio="urgent", gpus=8), job(4, team="b", prio="urgent", gpus=8)]
    p = plan(snap([pool("a", nodes=4)], pending=pending,
                  teams=[team("a", allowance=8), team("b", allowance=16)]))
    assert p.demoted == (2,)


def test_running_priority_work_uses_up_the_allowance():
    run = [running(1, 11, team="a", prio="high", alloc={"a-0": 8}),
           running(2, 12, team="b", prio="normal", alloc={"a-1": 8})]
    p = plan(snap([pool("a")], running=run, pending=[job(5, team="a", prio="urgent", gpus=8)],
                  teams=[team("a", allowance=8)]))
    assert p.demoted == (5,)
    assert p.preemptions == ()


# Team a (allowance 8) runs two high 8-GPU attempts; the one started later is beyond the
# allowance, counts as normal, and can be preempted by team b's high job.
RUNNING_CASES = [
    pytest.param((0, 100), "high", {}, [(2, 9)], id="newer-one-demoted-and-preempted"),
    pytest.param((100, 0), "high", {}, [(1, 9)], id="oldest-keeps-its-class"),
    pytest.param((0, 100), "high", {"anti_capture": False}, [], id="anti_capture-off"),
    pytest.param((0, 100), "normal", {}, [], id="normal-job-cannot-preempt-demoted"),
    pytest.param((0, 100), "urgent", {}, [(2, 9)], id="urgent-prefers-the-demoted-one"),
]


@pytest.mark.parametrize(("starts", "prio", "config", "victims"), RUNNING_CASES)
def test_running_beyond_allowance_counts_as_normal(starts, prio, config, victims):
    run = [running(1, 11, team="a", prio="high", alloc={"a-0": 8}, started=starts[0]),
           running(2, 12, team="a", prio="high", alloc={"a-1": 8}, started=starts[1])]
    p = plan(snap([pool("a")], running=run, pending=[job(9, team="b", prio=prio, gpus=8)],
                  teams=[team("a", allowance=8), team("b")], **config))
    assert preempted_for(p) == victims
    assert p.demoted == ()  # demoted lists pending jobs only


def test_within_allowance_running_is_not_preempted_by_high():
    run = [running(1, 11, team="a", prio="urgent", alloc={"a-0": 8})]
    p = plan(snap([pool("a", nodes=1)], running=run,
                  pending=[job(9, team="b", prio="high", gpus=8)],
                  teams=[team("a", allowance=8)]))
    assert p.preemptions == ()

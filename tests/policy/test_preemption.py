"""Steps 4c/4d and broker.policy.victims: who may be a victim, in what order, how few."""

from __future__ import annotations

import dataclasses

import pytest

from broker.policy import RunningView, plan

from .builders import held, job, placed, pool, preempted, preempted_for, running, snap, waiting

# -- victim order ---------------------------------------------------------------------------
# One 8-GPU node holding two 4-GPU attempts (ids 1 and 2); a high job needs 4 GPUs, so exactly
# one victim is needed and the first in victim order is chosen. now = 1000.

ORDER_CASES = [
    pytest.param(
        dict(prio="low", started=900), dict(prio="normal", started=999), {}, 1,
        id="lower-class-first-despite-more-lost-work",
    ),
    pytest.param(
        dict(prio="normal", started=999), dict(prio="low", started=0), {}, 2,
        id="lower-class-first-despite-being-older",
    ),
    pytest.param(
        # A: 50 s * 4 GPUs since its checkpoint = 200; B: 200 s * 4 = 800 (and B is younger)
        dict(started=0, ckpt=950), dict(started=800), {}, 1,
        id="least-work-lost-beats-youngest",
    ),
    pytest.param(
        # A: 300 s * 2 GPUs = 600; B: 250 s * 4 GPUs = 1000: GPU-seconds, not seconds
        dict(started=700, gpus=2), dict(started=750), {}, 1,
        id="work-lost-counts-gpus",
    ),
    pytest.param(
        # a checkpoint older than the attempt's start does not count: A loses 100 s * 4
        dict(started=900, ckpt=100), dict(started=850), {}, 1,
        id="checkpoint-before-start-ignored",
    ),
    pytest.param(
        # equal loss (400 each): the youngest attempt first
        dict(started=0, ckpt=900), dict(started=900), {}, 2,
        id="equal-loss:youngest-first",
    ),
    pytest.param(
        dict(started=900, job=12), dict(started=900, job=11), {}, 2, id="full-tie:job-id",
    ),
    pytest.param(
        dict(started=0, ckpt=999), dict(started=500), {"victim_order": "youngest"}, 2,
        id="youngest-mode-ignores-checkpoints",
    ),
    pytest.param(
        dict(started=500), dict(started=0, ckpt=999), {"victim_order": "youngest"}, 1,
        id="youngest-mode:latest-start",
    ),
    pytest.param(
        dict(prio="low", started=0), dict(prio="normal", started=900),
        {"victim_order": "youngest"}, 1, id="youngest-mode-still-class-first",
    ),
    pytest.param(
        dict(started=900, job=12), dict(started=900, job=11), {"victim_order": "youngest"}, 2,
        id="youngest-mode:job-id",
    ),
]


def _two_on_one_node(a: dict, b: dict) -> list:
    out = []
    for aid, kw in ((1, dict(a)), (2, dict(b))):
        gpus = kw.pop("gpus", 4)
        job_id = kw.pop("job", 10 + aid)
        kw.setdefault("prio", "low")
        out.append(running(aid, job_id, alloc={"a-0": gpus}, **kw))
    return out


@pytest.mark.parametrize(("a", "b", "config", "victim"), ORDER_CASES)
def test_victim_order(a, b, config, victim):
    s = snap([pool("a", nodes=1)], running=_two_on_one_node(a, b),
             pending=[job(9, prio="high", gpus=4)], **config)
    p = plan(s)
    assert preempted_for(p) == [(victim, 9)]
    assert p.placements == ()
    assert waiting(p)[9] == "preempting 1 job(s)"


def test_preemption_record():
    victims = [running(1, 11, alloc={"a-0": 4}, started=100, ckpt=700),
               running(2, 12, alloc={"a-0": 4}, started=400)]
    p = plan(snap([pool("a", nodes=1)], running=victims, pending=[job(9, prio="high", gpus=8)]))
    got = [(pe.attempt_id, pe.job_id, pe.for_job_id, pe.lost_gpu_s) for pe in p.preemptions]
    # 1: (1000 - 700) * 4 = 1200; 2: (1000 - 400) * 4 = 2400
    assert sorted(got) == [(1, 11, 9, 1200.0), (2, 12, 9, 2400.0)]
    assert held(p) == {9: {}}


def test_each_victim_is_chosen_once_in_queue_order():
    victims = [running(3, 13, alloc={"a-0": 8}, started=0),     # loses 8000
               running(5, 15, alloc={"a-1": 8}, started=900)]   # loses 800
    pending = [job(21, prio="high", gpus=8, submit=0), job(20, prio="urgent", gpus=8, submit=5),
               job(22, prio="high", gpus=8, submit=9)]
    p = plan(snap([pool("a")], running=victims, pending=pending))
    # urgent 20 first takes the cheaper victim, high 21 the other, nothing is left for 22
    assert preempted_for(p) == [(5, 20), (3, 21)]
    assert 22 in waiting(p)
    assert not waiting(p)[22].startswith("preempting")


def test_preempting_job_holds_the_free_gpus_of_its_nodes():
    run = [running(1, 11, prio="low", alloc={"a-0": 4}),
           running(2, 12, prio="urgent", alloc={"a-1": 8})]
    pending = [job(5, prio="high", gpus=8), job(6, prio="high", gpus=4, submit=1),
               job(7, prio="low", gpus=2, submit=2)]
    p = plan(snap([pool("a")], running=run, pending=pending))
    assert preempted_for(p) == [(1, 5)]
    assert held(p)[5] == {"a-0": 4}
    assert p.placements == ()  # 6 and 7 cannot take a-0's 4 free GPUs


# -- fewest victims -------------------------------------------------------------------------

FEWEST_CASES = [
    pytest.param(
        # a-0: one 8-GPU victim losing 8000; a-1: two 4-GPU victims losing 40 each
        pool("a"), [running(1, 11, alloc={"a-0": 8}, started=0),
                    running(2, 12, alloc={"a-1": 4}, started=990),
                    running(3, 13, alloc={"a-1": 4}, started=990)],
        job(9, prio="high", gpus=8), [1], id="one-8gpu-victim-beats-two-4gpu",
    ),
    pytest.param(
        # a-0: 4 free + one victim; a-1: 2 free + two cheap victims
        pool("a"), [running(1, 11, alloc={"a-0": 4}, started=0),
                    running(2, 12, alloc={"a-1": 3}, started=999),
                    running(3, 13, alloc={"a-1": 3}, started=999)],
        job(9, prio="high", gpus=8), [1], id="node-needing-1-beats-node-needing-2",
    ),
    pytest.param(
        # one node: victim order is 1 (cheap, 4 GPUs) then 2 (12 GPUs); 1 turns out unneeded
        pool("a", nodes=1, gpus=16), [running(1, 11, alloc={"a-0": 4}, started=990),
                                      running(2, 12, alloc={"a-0": 12}, started=0)],
        job(9, prio="high", gpus=12), [2], id="unneeded-victim-dropped",
    ),
    pytest.param(
        pool("a"), [running(1, 11, alloc={"a-0": 8}, started=0),
                    running(2, 12, alloc={"a-1": 8}, started=900)],
        job(9, prio="high", gpus=8), [2], id="equal-count:least-lost-work",
    ),
    pytest.param(
        pool("a"), [running(1, 11, prio="normal", alloc={"a-0": 8}, started=999),
                    running(2, 12, prio="low", alloc={"a-1": 8}, started=0)],
        job(9, prio="high", gpus=8), [2], id="equal-count:lower-class",
    ),
    pytest.param(
        pool("a", nodes=3), [running(1, 11, alloc={"a-0": 8}),
                             running(2, 12, alloc={"a-1": 4}, started=999),
                             running(3, 13, alloc={"a-1": 4}, started=999),
                             running(4, 14, alloc={"a-2": 8})],
        job(9, prio="high", gpus=8, nodes=2), [1, 4], id="gang:the-two-nodes-with-fewest",
    ),
    pytest.param(
        # a 2-node victim frees both nodes of the gang: one victim, not two
        pool("a", nodes=3), [running(1, 11, alloc={"a-0": 8, "a-1": 8}, started=900),
                             running(2, 12, alloc={"a-2": 8}, started=0)],
        job(9, prio="high", gpus=8, nodes=2), [1], id="gang:one-multi-node-victim",
    ),
    pytest.param(
        # issue 28 part 4: 11 and 12 each hold 4 GPUs on a-0 and 4 on a-1; 13 holds all of a-2
        # and has almost nothing to lose, so the greedy search takes it first. 11 and 12 alone
        # free two whole nodes: 13 is no longer needed and is dropped.
        pool("a", nodes=3), [running(1, 11, alloc={"a-0": 4, "a-1": 4}, started=0),
                             running(2, 12, alloc={"a-0": 4, "a-1": 4}, started=0),
                             running(3, 13, alloc={"a-2": 8}, started=999)],
        job(9, prio="high", gpus=8, nodes=2), [1, 2], id="gang:unneeded-victim-dropped",
    ),
    pytest.param(
        # a 4-GPU victim is not enough for an 8-GPU job on its node
        pool("a"), [running(1, 11, alloc={"a-0": 4}, started=999),
                    running(2, 12, prio="urgent", alloc={"a-0": 4}),
                    running(3, 13, alloc={"a-1": 8}, started=0)],
        job(9, prio="high", gpus=8), [3], id="victim-must-free-enough",
    ),
    pytest.param(
        # one node, victim order 4, 4, 8 (the 8-GPU one has run longest): one victim suffices
        pool("a", nodes=1, gpus=16), [running(1, 11, alloc={"a-0": 4}, started=999),
                                      running(2, 12, alloc={"a-0": 4}, started=998),
                                      running(3, 13, alloc={"a-0": 8}, started=0)],
        job(9, prio="high", gpus=8), [3], id="one-node:one-big-beats-two-earlier-small",
    ),
    pytest.param(
        # needs 6 on one node: {4-GPU, 2-GPU} and {4-GPU, 4-GPU} both have 2 victims; the
        # earliest in victim order wins (1 then 2), not the first that happens to be largest
        pool("a", nodes=1, gpus=16), [running(1, 11, alloc={"a-0": 4}, started=999),
                                      running(2, 12, alloc={"a-0": 2}, started=998),
                                      running(3, 13, alloc={"a-0": 4}, started=0),
                                      running(4, 14, alloc={"a-0": 6}, started=0, prio="urgent")],
        job(9, prio="high", gpus=6), [1, 2], id="one-node:equal-count-earliest-in-order",
    ),
]


@pytest.mark.parametrize(("p0", "run", "j", "victims"), FEWEST_CASES)
def test_fewest_victims(p0, run, j, victims):
    p = plan(snap([p0], running=run, pending=[j]))
    assert sorted(preempted(p)) == victims
    assert {fj for _, fj in preempted_for(p)} == {j.job_id}


def test_pool_needing_fewest_victims_wins_over_cheaper_pool():
    run = [running(i, 10 + i, alloc={node: 4}, started=999)
           for i, node in enumerate(["a-0", "a-0", "a-1", "a-1"], start=1)]
    run += [running(5, 15, alloc={"b-0": 8}, started=0), running(6, 16, alloc={"b-1": 8})]
    pools = [pool("a", price=0.0), pool("b", price=9.0)]
    p = plan(snap(pools, running=run, pending=[job(9, prio="high", gpus=8, nodes=2)]))
    assert sorted(preempted(p)) == [5, 6]


def test_equal_victims_prefers_the_first_candidate_pool():
    run = [running(1, 11, alloc={"a-0": 8}, started=500),
           running(2, 12, alloc={"b-0": 8}, started=500)]
    pools = [pool("b", nodes=1, price=2.0), pool("a", nodes=1, price=1.0)]
    p = plan(snap(pools, running=run, pending=[job(9, prio="high", gpus=8)]))
    assert preempted(p) == [1]  # same cost: the cheaper pool a


def test_victims_only_in_candidate_pools():
    run = [running(1, 11, alloc={"a-0": 8}, started=999),
           running(2, 12, alloc={"h-0": 8}, started=0)]
    pools = [pool("a", "A100", nodes=1), pool("h", "H100", nodes=1)]
    p = plan(snap(pools, running=run, pending=[job(9, prio="high", gpus=8, types=("H100",))]))
    assert preempted(p) == [2]


# -- only strictly lower classes ------------------------------------------------------------

CLASS_CASES = [
    pytest.param("normal", "normal", False, id="normal-vs-normal:no"),
    pytest.param("urgent", "urgent", False, id="urgent-vs-urgent:no"),
    pytest.param("low", "low", False, id="low-vs-low:no"),
    pytest.param("high", "urgent", False, id="high-vs-urgent:no"),
    pytest.param("normal", "high", False, id="normal-vs-high:no"),
    pytest.param("low", "normal", False, id="low-vs-normal:no"),
    pytest.param("normal", "low", True, id="normal-vs-low:yes"),
    pytest.param("high", "normal", True, id="high-vs-normal:yes"),
    pytest.param("urgent", "high", True, id="urgent-vs-high:yes"),
    pytest.param("urgent", "low", True, id="urgent-vs-low:yes"),
]


@pytest.mark.parametrize(("mine", "theirs", "yes"), CLASS_CASES)
def test_only_strictly_lower_classes_are_preempted(mine, theirs, yes):
    run = [running(1, 11, prio=theirs, alloc={"a-0": 8})]
    p = plan(snap([pool("a", nodes=1)], running=run, pending=[job(9, prio=mine, gpus=8)]))
    assert preempted_for(p) == ([(1, 9)] if yes else [])
    assert p.placements == ()
    if not yes:
        assert waiting(p)[9].startswith("head of the queue")


def test_equal_class_victim_is_skipped_for_a_lower_one():
    run = [running(1, 11, prio="normal", alloc={"a-0": 8}, started=999),
           running(2, 12, prio="low", alloc={"a-1": 8}, started=0)]
    p = plan(snap([pool("a")], running=run, pending=[job(9, prio="normal", gpus=8)]))
    assert preempted_for(p) == [(2, 9)]


def test_preemption_off():
    run = [running(1, 11, prio="low", alloc={"a-0": 8})]
    p = plan(snap([pool("a", nodes=1)], running=run, pending=[job(9, prio="urgent", gpus=8)],
                  preemption=False))
    assert p.preemptions == ()
    assert held(p) == {9: {}}


# -- minimum run time -----------------------------------------------------------------------

MIN_RUN_CASES = [
    pytest.param(0, 999, 300, True, id="never-preempted:at-once"),
    pytest.param(1, 800, 300, False, id="preempted-before:200s<300s"),
    pytest.param(3, 701, 300, False, id="preempted-thrice:299s<300s"),
    pytest.param(1, 700, 300, True, id="preempted-before:exactly-300s"),
    pytest.param(1, 500, 300, True, id="preempted-before:500s"),
    pytest.param(1, 999, 0, True, id="min_run_s=0"),
    pytest.param(2, 0, 1200, False, id="min_run_s=1200:1000s"),
]


@pytest.mark.parametrize(("times", "started", "min_run", "yes"), MIN_RUN_CASES)
def test_minimum_run_time(times, started, min_run, yes):
    run = [running(1, 11, alloc={"a-0": 8}, started=started, preempted=times)]
    p = plan(snap([pool("a", nodes=1)], running=run, pending=[job(9, prio="high", gpus=8)],
                  min_run_s=min_run))
    assert preempted(p) == ([1] if yes else [])


def test_protected_victim_is_passed_over_for_a_costlier_one():
    run = [running(1, 11, alloc={"a-0": 8}, started=900, preempted=1),  # protected, cheap
           running(2, 12, alloc={"a-1": 8}, started=0)]                # loses 8000
    p = plan(snap([pool("a")], running=run, pending=[job(9, prio="high", gpus=8)]))
    assert preempted(p) == [2]


@pytest.mark.parametrize(("now", "yes"), [(1100, False), (1200, True)])
def test_plan_now_argument_overrides_snapshot_now(now, yes):
    run = [running(1, 11, alloc={"a-0": 8}, started=900, preempted=1)]
    s = snap([pool("a", nodes=1)], running=run, pending=[job(9, prio="high", gpus=8)], now=0)
    assert preempted(plan(s, now=now)) == ([1] if yes else [])


# -- victims already stopping ---------------------------------------------------------------


def test_stopping_victims_enough_no_extra_victims_and_free_gpus_held():
    run = [running(1, 11, alloc={"a-0": 4}, stopping=True, stopping_for=5),
           running(2, 12, alloc={"a-1": 8})]
    pending = [job(5, prio="high", gpus=8), job(6, team="b", prio="low", gpus=4, submit=1),
               job(7, team="b", prio="low", gpus=1, submit=2)]
    p = plan(snap([pool("a")], running=run, pending=pending))
    assert p.preemptions == ()
    assert held(p)[5] == {"a-0": 4}
    assert waiting(p)[5] == "waiting for preempted jobs to stop"
    assert p.placements == ()  # a-0's 4 free GPUs are kept for job 5


def test_without_the_stopping_victim_a_new_one_is_chosen():
    # the same cluster, but attempt 1 is not yet stopping: job 5 picks it (cheapest)
    run = [running(1, 11, alloc={"a-0": 4}),
           running(2, 12, alloc={"a-1": 8})]
    p = plan(snap([pool("a")], running=run, pending=[job(5, prio="high", gpus=8)]))
    assert preempted_for(p) == [(1, 5)]
    assert held(p)[5] == {"a-0": 4}


def test_stopping_victims_not_enough_adds_only_what_is_missing():
    run = [running(1, 11, alloc={"a-0": 8}, stopping=True, stopping_for=5),
           running(2, 12, alloc={"a-1": 8}, started=0),
           running(3, 13, alloc={"a-2": 8}, started=900)]
    p = plan(snap([pool("a", nodes=3)], running=run,
                  pending=[job(5, prio="high", gpus=8, nodes=2)]))
    assert preempted_for(p) == [(3, 5)]  # a-0 is coming; one more node, the cheapest victim


def test_stopping_victims_elsewhere_do_not_count_for_another_job():
    run = [running(1, 11, alloc={"a-0": 8}, stopping=True, stopping_for=99),
           running(2, 12, alloc={"a-1": 8})]
    p = plan(snap([pool("a")], running=run, pending=[job(5, prio="high", gpus=8)]))
    assert preempted_for(p) == [(2, 5)]


def test_stopping_victim_frees_enough_placed_when_free_already():
    run = [running(1, 11, alloc={"a-0": 8}, stopping=True, stopping_for=5)]
    p = plan(snap([pool("a")], running=run, pending=[job(5, prio="high", gpus=8)]))
    # a-1 is free now: no need to wait for a-0
    assert placed(p) == {5: ("a", {"a-1": 8})}
    assert p.preemptions == ()


def test_stopping_for_me_but_an_earlier_gang_failed_to_find_victims():
    # Job 4 is ahead in the queue but a-0 is being freed for job 5, so job 4 finds no victims.
    # Job 5 still needs a second node: it must get the normal attempt on a-1 as a new victim
    # ("no new victims unless those are no longer enough").
    run = [running(1, 11, alloc={"a-0": 8}, stopping=True, stopping_for=5),
           running(2, 12, prio="normal", alloc={"a-1": 8})]
    pending = [job(4, prio="high", gpus=8, nodes=2, submit=0),
               job(5, prio="high", gpus=8, nodes=2, submit=1)]
    p = plan(snap([pool("a")], running=run, pending=pending))
    assert preempted_for(p) == [(2, 5)]
    assert waiting(p)[5] == "preempting 1 job(s)"


def test_stopping_victims_not_enough_and_no_new_ones_still_holds_their_node():
    # a-0: 4 free + 4 stopping for job 5; a-2: 6 free; a-3: 5 free; the rest is urgent.
    # Job 5 (2 x 8) cannot be completed by new victims, so it reserves (4e): the node being
    # freed for it fits it soonest, and its free GPUs stay held ("it holds the GPUs on their
    # nodes"), so the later low job backfills a-3 instead.
    run = [running(1, 11, alloc={"a-0": 4}, stopping=True, stopping_for=5),
           running(2, 12, prio="urgent", alloc={"a-1": 8}),
           running(3, 13, prio="urgent", alloc={"a-2": 2}),
           running(4, 14, prio="urgent", alloc={"a-3": 3})]
    pending = [job(5, prio="high", gpus=8, nodes=2), job(6, prio="low", gpus=4, submit=1)]
    p = plan(snap([pool("a", nodes=4)], running=run, pending=pending))
    assert p.preemptions == ()
    assert held(p) == {5: {"a-0": 4, "a-2": 6}}
    assert placed(p) == {6: ("a", {"a-3": 4})}


# -- checkpoint alignment: a normal job waits for its victims' imminent checkpoints ------------
def _ckpt_victim(prio: str = "low", period: float | None = 1800.0, origin: float = 0.0,
                 started: float = 0.0) -> RunningView:
    r = running(1, 11, prio=prio, alloc={"a-0": 8}, started=started)
    return dataclasses.replace(r, checkpoint_period_s=period, checkpoint_origin=origin)


ALIGN_CASES = [
    # now 1000: the victim last saved never, next at 1800 (800 s away)
    pytest.param({"checkpoint_align_s": 900.0}, "normal", _ckpt_victim(), [], 1801.0,
                 id="checkpoint-in-800s:waits-for-it"),
    pytest.param({"checkpoint_align_s": 600.0}, "normal", _ckpt_victim(), [(1, 9)], None,
                 id="checkpoint-too-far:preempts-now"),
    pytest.param({"checkpoint_align_s": 900.0}, "high", _ckpt_victim(), [(1, 9)], None,
                 id="high-does-not-wait"),
    pytest.param({"checkpoint_align_s": 900.0, "checkpoint_on_signal": 1.0}, "normal",
                 _ckpt_victim(), [(1, 9)], None, id="every-victim-saves-on-the-signal:no-wait"),
    pytest.param({"checkpoint_align_s": 900.0}, "normal", _ckpt_victim(period=None), [(1, 9)], None,
                 id="schedule-unknown:preempts-now"),
    pytest.param({"checkpoint_align_s": 900.0}, "normal", _ckpt_victim(origin=1000.0, started=1000.0),
                 [(1, 9)], None, id="nothing-unsaved:preempts-now"),
]


@pytest.mark.parametrize(("config", "prio", "victim", "expect", "wake"), ALIGN_CASES)
def test_checkpoint_alignment(config, prio, victim, expect, wake):
    p = plan(snap([pool("a", nodes=1)], running=[victim], pending=[job(9, prio=prio, gpus=8)],
                  **config))
    assert preempted_for(p) == expect
    assert p.wake_at == wake
    assert held(p) == ({9: {}} if expect else {})  # waiting for checkpoints holds nothing


# -- patience: a job below high preempts only after waiting preempt_after_s --------------------
PATIENCE_CASES = [
    pytest.param(300.0, "normal", 900.0, [], 1200.0, id="waited-100s-of-300:waits"),
    pytest.param(300.0, "normal", 0.0, [(1, 9)], None, id="waited-1000s:preempts"),
    pytest.param(300.0, "high", 900.0, [(1, 9)], None, id="high-preempts-at-once"),
    pytest.param(0.0, "normal", 900.0, [(1, 9)], None, id="off:preempts-at-once"),
]


@pytest.mark.parametrize(("after", "prio", "submit", "expect", "wake"), PATIENCE_CASES)
def test_preempt_after_waiting(after, prio, submit, expect, wake):
    run = [running(1, 11, prio="low", alloc={"a-0": 8}, started=0.0)]
    p = plan(snap([pool("a", nodes=1)], running=run,
                  pending=[job(9, prio=prio, gpus=8, submit=submit)], preempt_after_s=after))
    assert preempted_for(p) == expect
    assert p.wake_at == wake

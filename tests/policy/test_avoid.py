"""A job that failed to start on some nodes avoids them while other nodes could take it
(broker.policy.avoid), and plan() places it accordingly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.policy import plan
from broker.policy.avoid import avoid_nodes
from tests.policy.builders import NOW, job, pool, running, snap


def failed(pending, *nodes: str):  # type: ignore[no-untyped-def]
    return replace(pending, failed_on=frozenset(nodes))


# (case, the job, the pools, the nodes it must avoid)
CASES = [
    ("never failed", job(1), [pool("a", nodes=3)], set()),
    ("failed on one of three", failed(job(1), "a-0"), [pool("a", nodes=3)], {"a-0"}),
    ("failed on every node", failed(job(1), "a-0", "a-1"), [pool("a", nodes=2)], set()),
    ("the only other pool is of another type", failed(job(1, types=["A100"]), "a-0"),
     [pool("a", nodes=1), pool("h", gpu_type="H100", nodes=4)], set()),
    ("another pool of its type", failed(job(1), "a-0"), [pool("a", nodes=1), pool("b", nodes=1)], {"a-0"}),
    ("the other pool is another team's", failed(job(1, team="x"), "a-0"),
     [pool("a", nodes=1), pool("b", nodes=2, teams=["y"])], set()),
    ("the other nodes are too small", failed(job(1, gpus=8), "a-0"),
     [pool("a", nodes=1, gpus=8), pool("b", nodes=3, gpus=4)], set()),
    ("a gang needs two other nodes, one is left", failed(job(1, nodes=2), "a-0", "a-1"),
     [pool("a", nodes=3)], set()),
    ("a gang needs two other nodes, two are left", failed(job(1, nodes=2), "a-0", "a-1"),
     [pool("a", nodes=4)], {"a-0", "a-1"}),
]


@pytest.mark.parametrize(("case", "pending", "pools", "avoid"), CASES, ids=[c[0] for c in CASES])
def test_avoid_nodes(case, pending, pools, avoid):  # type: ignore[no-untyped-def]
    assert avoid_nodes(pending, pools) == avoid


def test_plan_places_it_on_another_node_even_where_best_fit_would_pick_the_failed_one():
    # a-0 is the fullest node that fits (best fit picks it first): the job goes to a-1
    s = snap([pool("a", nodes=2)], pending=[failed(job(1, gpus=4), "a-0")],
             running=[running(10, 10, alloc={"a-0": 4})])
    assert [pl.alloc for pl in plan(s).placements] == [(("a-1", 4),)]


def test_plan_makes_it_wait_while_the_other_nodes_are_busy_and_preempts_nothing_for_it():
    s = snap([pool("a", nodes=2)], pending=[failed(job(1, gpus=8, prio="urgent"), "a-0")],
             running=[running(10, 10, alloc={"a-1": 8}, prio="low")])
    p = plan(s)
    assert not p.placements and not p.preemptions
    assert "other than a-0" in dict(p.waiting)[1]


def test_plan_places_it_where_it_failed_when_there_is_no_other_node():
    s = snap([pool("a", nodes=1)], pending=[failed(job(1), "a-0")])
    assert [pl.alloc for pl in plan(s).placements] == [(("a-0", 1),)]


def test_the_rule_is_pure_and_the_snapshot_unchanged():
    s = snap([pool("a", nodes=2)], pending=[failed(job(1), "a-0")], now=NOW)
    before = repr(s)
    plan(s)
    assert repr(s) == before

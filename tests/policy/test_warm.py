"""Warm nodes first (broker.policy.warm, issue 26): among nodes that fit a job equally, one that
holds its code snapshot is chosen; a better fit, another pool's order or room still decide
first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.policy import plan
from broker.policy.warm import warm_first, warm_nodes
from tests.policy.builders import job, placed, pool, running, snap


@pytest.mark.parametrize("nodes, warm, first", [
    (["a-0", "a-1", "a-2"], set(), ["a-0", "a-1", "a-2"]),
    (["a-0", "a-1", "a-2"], {"a-2"}, ["a-2", "a-0", "a-1"]),
    (["a-0", "a-1", "a-2"], {"a-2", "a-0"}, ["a-0", "a-2", "a-1"]),
    (["a-0", "a-1"], {"b-9"}, ["a-0", "a-1"]),  # warm elsewhere: order unchanged
])
def test_warm_first_keeps_each_groups_order(nodes: list[str], warm: set[str], first: list[str]) -> None:
    assert warm_first(nodes, warm) == first


def test_warm_nodes_are_those_reporting_the_digest() -> None:
    held = {"a-0": frozenset({"x" * 64}), "a-1": frozenset({"y" * 64}), "a-2": frozenset({"x" * 64})}
    assert warm_nodes("x" * 64, held) == {"a-0", "a-2"}
    assert warm_nodes(None, held) == frozenset()


def warm(j, *nodes: str):  # type: ignore[no-untyped-def]
    return replace(j, warm_on=frozenset(nodes))


# (case, pools, running, the job, the node it must land on)
CASES = [
    ("cold: the pool's order", [pool("a", nodes=3)], [], job(1, gpus=8), "a-0"),
    ("warm among equals", [pool("a", nodes=3)], [], warm(job(1, gpus=8), "a-2"), "a-2"),
    ("a better fit beats warmth", [pool("a", nodes=2)], [running(1, 9, alloc={"a-0": 4})],
     warm(job(1, gpus=4), "a-1"), "a-0"),
    ("warm but full: the cold one", [pool("a", nodes=2)], [running(1, 9, alloc={"a-1": 8})],
     warm(job(1, gpus=8), "a-1"), "a-0"),
    ("warm in the pool it goes to only", [pool("a", nodes=2), pool("b", nodes=2)], [],
     warm(job(1, gpus=8), "b-1"), "a-0"),
]


@pytest.mark.parametrize(("case", "pools", "run", "pending", "node"), CASES, ids=[c[0] for c in CASES])
def test_plan_prefers_a_warm_node_among_equals(case, pools, run, pending, node):  # type: ignore[no-untyped-def]
    got = placed(plan(snap(pools, run, [pending])))
    assert list(got[pending.job_id][1]) == [node]

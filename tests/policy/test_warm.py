"""Warm nodes first (broker.policy.warm, issue 26): among nodes that fit a job equally, one that
holds its code snapshot is chosen; a better fit, another pool's order or room still decide
first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.policy import plan
from broker.policy.warm import image_ref, warm_first, warm_nodes
from tests.policy.builders import job, placed, pool, running, snap


@pytest.mark.parametrize("nodes, warm, first", [
    (["a-0", "a-1", "a-2"], set(), ["a-0", "a-1", "a-2"]),
    (["a-0", "a-1", "a-2"], {"a-2"}, ["a-2", "a-0", "a-1"]),
    (["a-0", "a-1", "a-2"], {"a-2", "a-0"}, ["a-0", "a-2", "a-1"]),
    (["a-0", "a-1"], {"b-9"}, ["a-0", "a-1"]),  # warm elsewhere: order unchanged
])
def test_warm_first_keeps_each_groups_order(nodes: list[str], warm: set[str], first: list[str]) -> None:
    assert warm_first(nodes, warm) == first


X, Y = "x" * 64, "y" * 64
IMG = "ghcr.io/lab/train:3"


@pytest.mark.parametrize("code, image, held, want", [
    (X, None, {"a-0": {X}, "a-1": {Y}, "a-2": {X}}, {"a-0", "a-2"}),
    (None, None, {"a-0": {X}}, set()),  # needs nothing: none warm
    (X, None, {"a-0": {Y}}, set()),  # nobody holds it
    (None, IMG, {"a-0": {X}, "a-1": {IMG}}, {"a-1"}),  # the image alone
    (X, IMG, {"a-0": {X}, "a-1": {IMG}, "a-2": {X, IMG}}, {"a-2"}),  # both beat either
    (X, IMG, {"a-0": {X}, "a-1": {IMG}}, {"a-0", "a-1"}),  # one each: equals
    (None, "python:3.11", {"a-0": {"docker.io/library/python:3.11"}}, {"a-0"}),  # as runtimes list it
    (None, "lab/train", {"a-0": {"docker.io/lab/train:latest"}}, {"a-0"}),
    (None, "python:3.12", {"a-0": {"docker.io/library/python:3.11"}}, set()),  # another tag
])
def test_warm_nodes_hold_the_most_of_what_the_job_needs(code: str | None, image: str | None,
                                                        held: dict[str, set[str]], want: set[str]) -> None:
    assert warm_nodes(code, {n: frozenset(h) for n, h in held.items()}, image) == want


@pytest.mark.parametrize("image, ref", [
    ("python", "docker.io/library/python:latest"),
    ("python:3.11", "docker.io/library/python:3.11"),
    ("lab/train:3", "docker.io/lab/train:3"),
    ("ghcr.io/lab/train", "ghcr.io/lab/train:latest"),
    ("127.0.0.1:5055/onepool/bb:1", "127.0.0.1:5055/onepool/bb:1"),
    ("localhost/onepool-setup:ab", "localhost/onepool-setup:ab"),
    ("ghcr.io/lab/train@sha256:" + "c" * 64, "ghcr.io/lab/train@sha256:" + "c" * 64),
])
def test_image_references_are_normalized_as_runtimes_list_them(image: str, ref: str) -> None:
    assert image_ref(image) == ref


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

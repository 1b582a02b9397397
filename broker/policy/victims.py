"""Preemption victims: the documented order and the fewest-victims search. Pure.

Victim order (the sort key, first field first):
1. lower effective class first (low before normal before high);
2. least work lost: GPU-seconds since the victim's last committed checkpoint
   (``victim_order="youngest"`` skips this field: the naive baseline);
3. the youngest attempt first (latest start);
4. job id, as the tie-break.

Who can be a victim: a running attempt, not already stopping, of a strictly lower effective
class than the job it makes room for, and not protected by the minimum run time (a job that
was preempted before cannot be preempted again until it has run ``min_run_s`` since restarting).

Fewest victims: for every candidate node, the smallest number of victims that makes it fit,
and among sets of that size the earliest in victim order (so a single large victim beats
several small ones, on one node or across nodes). The job's nodes are the ones needing the
fewest victims (ties: the cheapest victims by the order above); the pool is the one needing
the fewest in all.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

from broker.policy.snapshot import RunningView

VictimKey = tuple[float, ...]


def lost_gpu_s(r: RunningView, now: float) -> float:
    """GPU-seconds of work since the attempt's last checkpoint (or its start)."""
    ck = r.last_checkpoint(now)
    since = r.started_at if ck is None else max(r.started_at, ck)
    return max(0.0, now - since) * r.gpus


def victim_key(r: RunningView, rank: int, now: float, mode: str) -> VictimKey:
    if mode == "youngest":
        return (rank, -r.started_at, r.job_id)
    return (rank, lost_gpu_s(r, now), -r.started_at, r.job_id)


def preemptable(r: RunningView, now: float, min_run_s: float) -> bool:
    return not r.stopping and (r.times_preempted == 0 or now - r.started_at >= min_run_s)


def node_victims(
    need: int,
    base_free: int,
    on_node: Sequence[tuple[VictimKey, RunningView, int]],
    eligible: Callable[[RunningView, VictimKey], bool],
) -> list[tuple[VictimKey, RunningView]] | None:
    """The fewest victims that bring one node from base_free to `need` GPUs; among sets of
    that size, the earliest in victim order.

    `on_node` lists (key, attempt, GPUs it holds on this node), sorted by key. Returns [] when
    the node already fits, None when even every eligible victim would not be enough.
    """
    short = need - base_free
    if short <= 0:
        return []
    cands = [(k, r, g) for k, r, g in on_node if eligible(r, k)]
    sizes = sorted((g for _, _, g in cands), reverse=True)
    k, acc = 0, 0
    while acc < short and k < len(sizes):
        acc += sizes[k]
        k += 1
    if acc < short:
        return None
    # Greedy in victim order: take a candidate if the set can still be completed within k.
    chosen: list[tuple[VictimKey, RunningView]] = []
    got = 0
    for i, (key, r, g) in enumerate(cands):
        left = k - len(chosen) - 1
        best_rest = sum(sorted((x[2] for x in cands[i + 1:]), reverse=True)[:left])
        if got + g + best_rest >= short:
            chosen.append((key, r))
            got += g
            if got >= short:
                return chosen
    raise AssertionError("unreachable: k victims were shown to suffice")


def pick_nodes(
    nodes: Sequence[str],
    n: int,
    need: int,
    base_free: Mapping[str, int],
    by_node: Mapping[str, Sequence[tuple[VictimKey, RunningView, int]]],
    eligible: Callable[[RunningView, VictimKey], bool],
) -> tuple[tuple[int, list[VictimKey]], list[str], dict[int, RunningView]] | None:
    """Choose n nodes of one pool that fit `need` GPUs each with the fewest victims.

    Returns (cost, nodes, victims by attempt id) where cost = (victim count, sorted keys), or
    None when the pool cannot be made to fit.
    """
    options: list[tuple[int, list[VictimKey], str, list[tuple[VictimKey, RunningView]]]] = []
    for node in nodes:
        vs = node_victims(need, base_free.get(node, 0), by_node.get(node, ()), eligible)
        if vs is not None:
            options.append((len(vs), [k for k, _ in vs], node, vs))
    if len(options) < n:
        return None
    best = heapq.nsmallest(n, options, key=lambda o: (o[0], o[1]))
    victims: dict[int, RunningView] = {}
    keys: dict[int, VictimKey] = {}
    for _, _, _, vs in best:
        for k, r in vs:
            victims[r.attempt_id] = r
            keys[r.attempt_id] = k
    cost = (len(victims), sorted(keys.values()))
    return cost, [o[2] for o in best], victims

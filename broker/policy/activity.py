"""Can anything act now? A cheap test of whether plan() could place, preempt, launch or
terminate anything, from counters a caller keeps (the simulator keeps them incrementally and
skips building a snapshot when the answer is no). Pure.

plan() would act only if one of these holds:
- a rented pool exists (renting after a wait, idle timeouts: time rules plan() computes);
- some waiting job's shape fits the free GPUs of some node (placement or backfill);
- preemption is on, something runs, and the highest waiting class (one higher with aging,
  never above high) is above the lowest class anything runs at (anti-capture may schedule
  running high/urgent work as normal: `rank_floor`).
When can_act() is False, plan() places, preempts, launches and terminates nothing (tested on
generated snapshots against plan() itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.policy.config import PolicyConfig
from broker.policy.snapshot import Snapshot
from broker.spec import Priority

HIGH_RANK = Priority.HIGH.rank
NORMAL_RANK = Priority.NORMAL.rank


@dataclass(frozen=True, slots=True)
class Activity:
    """What can_act reads. `fits`: some waiting job's shape fits some node's free GPUs."""

    pending: int
    fits: bool
    top_pending_rank: int | None
    lowest_running_rank: int | None  # lowest rank_floor over running attempts
    rented_pools: bool
    rented_nodes: bool


def rank_floor(priority: Priority, cfg: PolicyConfig) -> int:
    """The lowest effective class a running attempt of this class can have."""
    if cfg.anti_capture and cfg.classes and priority.rank > NORMAL_RANK:
        return NORMAL_RANK
    return priority.rank


def can_act(a: Activity, cfg: PolicyConfig) -> bool:
    """False only when plan() provably has nothing to do (see the module docstring)."""
    if a.rented_pools and cfg.cloud:
        return a.pending > 0 or a.rented_nodes
    if a.rented_nodes:
        return True  # idle rented nodes time out even when renting is off
    if not a.pending:
        return False
    if a.fits:
        return True
    if not cfg.preemption or a.lowest_running_rank is None or a.top_pending_rank is None:
        return False
    top = a.top_pending_rank
    if cfg.promote_after_s is not None and top < HIGH_RANK:
        top += 1
    return top > a.lowest_running_rank


def summarize(snap: Snapshot) -> Activity:
    """can_act's inputs, read from a snapshot (O(size of the snapshot))."""
    used: dict[str, int] = {}
    for r in snap.running:
        for node, g in r.alloc:
            used[node] = used.get(node, 0) + g
    free = {nd.id: min(nd.gpus, p.gpus_per_node) - (nd.used if nd.used is not None else used.get(nd.id, 0))
            for p in snap.pools for nd in p.nodes}
    fits = False
    for j in snap.pending:
        for p in snap.pools:
            if (j.gpu_types and p.gpu_type not in j.gpu_types) or p.gpus_per_node < j.gpus_per_node:
                continue
            if (p.teams is not None and j.team not in p.teams):
                continue
            if sum(1 for nd in p.nodes if free[nd.id] >= j.gpus_per_node) >= j.nodes:
                fits = True
                break
        if fits:
            break
    cfg = snap.config
    return Activity(
        pending=len(snap.pending), fits=fits,
        top_pending_rank=max((j.priority.rank for j in snap.pending), default=None),
        lowest_running_rank=min((rank_floor(r.priority, cfg) for r in snap.running), default=None),
        rented_pools=any(p.max_nodes is not None for p in snap.pools),
        rented_nodes=any(p.max_nodes is not None and p.nodes for p in snap.pools))

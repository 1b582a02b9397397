"""Rules about pools and nodes the engine and the simulator apply before plan(). Pure.

- Closing: a rented pool whose provider refused a launch (no capacity: a spot stock-out) is
  closed to launches for NO_CAPACITY_BACKOFF_S; after a fatal error, FATAL_BACKOFF_S. A
  closed pool keeps its nodes but cannot grow (`capped`), so the next plan falls through to
  the next-cheapest offer.
- Draining: a node under an interruption notice takes no new work; its view shows no free
  GPU (`draining`), so nothing is placed or reserved there while it empties.
- could_ever_run: whether any pool could ever hold a job of this shape (a partition too small,
  or no pool of its GPU types, and it can never start: report it, do not wait forever).
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.policy.snapshot import NodeView, PoolView

NO_CAPACITY_BACKOFF_S = 300.0
FATAL_BACKOFF_S = 3600.0


def closed_until(now: float, fatal: bool = False) -> float:
    """Until when a pool that just refused a launch stays closed to launches."""
    return now + (FATAL_BACKOFF_S if fatal else NO_CAPACITY_BACKOFF_S)


def capped(max_nodes: int | None, alive: int, closed: bool) -> int | None:
    """A rented pool's `max_nodes` for the plan: its quota, or, while it is closed, the nodes
    it has (ready or launching): it may not grow."""
    if max_nodes is None:
        return None
    return alive if closed else max_nodes


def draining(node_id: str, held: int, idle_since: float | None = None) -> NodeView:
    """The view of a node under an interruption notice: only what attempts still hold on it
    counts as its capacity, so it takes no new work."""
    return NodeView(node_id, held, idle_since, held)


def could_ever_run(gpus: int, gpu_types: tuple[str, ...], team: str, pools: Iterable[PoolView]) -> bool:
    """Whether some pool could ever hold `gpus` GPUs (one node, or whole nodes of a pool)
    of an acceptable type, for this team, at its largest (rented pools: max_nodes)."""
    for p in pools:
        if gpu_types and p.gpu_type not in gpu_types:
            continue
        if p.teams is not None and team not in p.teams:
            continue
        cap_nodes = p.max_nodes if p.max_nodes is not None else len(p.nodes)
        per = min(gpus, p.gpus_per_node)
        if gpus % per == 0 and gpus // per <= cap_nodes:
            return True
    return False

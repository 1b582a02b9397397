"""Where a job that failed to start should not go again.

A job whose rank could not start on a node for a reason that may be the node's (its working
directory or interpreter missing there: providers.start_errors) carries those nodes in
`PendingView.failed_on`. It avoids them as long as some pool it may use has enough other
nodes big enough for it; otherwise it avoids nothing (it tries again where it failed, and the
broker's bound on start failures ends it). Rented nodes not launched yet do not count as
"other nodes": a job is never kept from running only to rent a node it might start on.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.policy.snapshot import PendingView, PoolView


def usable_by(j: PendingView, p: PoolView) -> bool:
    """Whether `p` could ever hold `j` by its GPU type, partition and node size (its market
    and current load aside)."""
    return ((not j.gpu_types or p.gpu_type in j.gpu_types)
            and (p.teams is None or j.team in p.teams)
            and p.gpus_per_node >= j.gpus_per_node)


def avoid_nodes(j: PendingView, pools: Iterable[PoolView]) -> frozenset[str]:
    """The nodes `j` must not be placed on now: `j.failed_on` when a pool it may use has at
    least `j.nodes` other nodes with `j.gpus_per_node` GPUs, else none."""
    if not j.failed_on:
        return frozenset()
    for p in pools:
        if usable_by(j, p):
            others = sum(1 for n in p.nodes if n.id not in j.failed_on and n.gpus >= j.gpus_per_node)
            if others >= j.nodes:
                return j.failed_on
    return frozenset()

"""Defragmentation: free whole nodes for a gang job by moving small jobs. Pure.

When a multi-node (gang) job waits although its pool has enough free GPUs, because they are
scattered over partly used nodes, some single-node attempts can move (checkpoint now, stop,
restart on another node of the same pool: broker.policy.rebalance.Move) so that whole nodes
free up. The rule:

1. Only the first waiting gang job in queue order (class, then submit time) that has waited
   at least `defrag_after_s` since submission, per round: moves for one gang at a time.
2. Per candidate pool (the job's GPU types, spot policy, partition, node size): nodes that
   already fit it count; each other node is "cleared" by the cheapest set of movable
   attempts on it whose GPUs bring it to the job's GPUs per node. Movable: single-node,
   running (not stopping), no move in flight, run at least `min_run_s`, and of a class no
   higher than the gang's (a gang never moves more important work). The cheapest nodes to
   clear are chosen.
3. The movers must fit, first-fit by size (largest first), on the free GPUs of the pool's
   other nodes (never on the gang's nodes). Free GPUs are what this round's plan leaves:
   placements and other jobs' reservations are respected.
4. It is worth it when the gang's waiting costs more than the moves:
       wait_usd = gang GPUs x waited_h x wait_value_usd_per_gpu_hour    (it is expected to
                  wait as long again as it has waited: the longer the wait, the likelier)
       cost_usd = sum of each mover's move cost (restart in place, saving its state)
   and it moves only if wait_usd x realized_defrag > cost_usd (what past defragmenting
   moves realized per dollar of avoided wait they were expected to: RebalanceConfig,
   broker.policy.rebalance_realized).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

from broker.policy.rebalance import AttemptFacts, Move, RebalanceConfig, free_after, move_cost
from broker.policy.rebalance_realized import pays
from broker.policy.snapshot import PendingView, Plan, PoolView, RunningView, Snapshot
from broker.spec import market_ok


def defrag(snap: Snapshot, p: Plan, facts: Mapping[int, AttemptFacts],
           rc: RebalanceConfig = RebalanceConfig(), busy: frozenset[int] = frozenset()
           ) -> tuple[Move, ...]:
    """The moves that free whole nodes for the first long-waiting gang job (see the module
    docstring); () when none is needed or it is not worth it. Nothing is mutated."""
    placed = {pl.job_id for pl in p.placements}
    # queue order: the highest class first, then the longest waiting (plan.waiting is only
    # filled when reasons are asked for)
    for j in sorted(snap.pending, key=lambda j: (-j.priority.rank, j.submit_time, j.job_id)):
        if j.nodes < 2 or j.job_id in placed or snap.now - j.submit_time < rc.defrag_after_s:
            continue
        best: tuple[float, tuple[Move, ...]] | None = None
        for pool in snap.pools:
            if not _accepts(pool, j):
                continue
            moves = _for_pool(snap, p, pool, j, facts, rc, busy)
            if moves is not None and (best is None or moves[0] < best[0]):
                best = moves
        return best[1] if best is not None else ()  # one gang per round: the first one
    return ()


def _accepts(pool: PoolView, j: PendingView) -> bool:
    return ((not j.gpu_types or pool.gpu_type in j.gpu_types) and market_ok(j.spot, pool.market)
            and (pool.teams is None or j.team in pool.teams) and pool.gpus_per_node >= j.gpus_per_node
            and len(pool.nodes) >= j.nodes)


def _for_pool(snap: Snapshot, p: Plan, pool: PoolView, j: PendingView,
              facts: Mapping[int, AttemptFacts], rc: RebalanceConfig, busy: frozenset[int]
              ) -> tuple[float, tuple[Move, ...]] | None:
    """(cost, moves) that free enough nodes of `pool` for j, if the pool has the GPUs and
    the moves are worth it; None otherwise."""
    free = free_after(snap, p, keep_for=j.job_id)
    ids = [nd.id for nd in pool.nodes]
    g = j.gpus_per_node
    if sum(max(0, free.get(nd, 0)) for nd in ids) < j.gpus:
        return None  # not fragmentation: the GPUs are not there at all
    fits = [nd for nd in ids if free.get(nd, 0) >= g]
    short = j.nodes - len(fits)
    if short <= 0:
        return None
    on_node: dict[str, list[RunningView]] = {nd: [] for nd in ids}
    for r in snap.running:
        if len(r.alloc) == 1 and r.alloc[0][0] in on_node:
            on_node[r.alloc[0][0]].append(r)
    cost_of: dict[int, float] = {}
    clear: list[tuple[float, str, tuple[RunningView, ...]]] = []
    for nd in ids:
        if nd in fits:
            continue
        movable = [r for r in on_node[nd] if _movable(r, j, facts, snap, busy)]
        for r in movable:
            cost_of[r.attempt_id] = move_cost(r, pool, pool, facts[r.attempt_id], 0, snap, rc)
        pick = _cheapest_cover(movable, g - free.get(nd, 0), cost_of)
        if pick is not None:
            clear.append((sum(cost_of[r.attempt_id] for r in pick), nd, pick))
    if len(clear) < short:
        return None
    clear.sort(key=lambda c: (c[0], c[1]))
    chosen = clear[:short]
    gang_nodes = set(fits) | {nd for _, nd, _ in chosen}
    room = {nd: free.get(nd, 0) for nd in ids if nd not in gang_nodes}
    movers = sorted((r for _, _, rs in chosen for r in rs), key=lambda r: (-r.gpus, r.job_id))
    moves: list[Move] = []
    for r in movers:
        target = min((nd for nd in room if room[nd] >= r.gpus), key=lambda nd: (room[nd], nd),
                     default=None)
        if target is None:
            return None  # the movers have nowhere to go in this pool
        room[target] -= r.gpus
        moves.append(Move(r.attempt_id, r.job_id, pool.name, pool.name, ((target, r.gpus),), 0,
                          0.0, cost_of[r.attempt_id], f"defragment for gang job {j.job_id}",
                          pool.price_per_gpu_hour, pool.price_per_gpu_hour))
    cost = sum(m.cost_usd for m in moves)
    wait_usd = j.gpus * (snap.now - j.submit_time) / 3600.0 * snap.config.wait_value_usd_per_gpu_hour
    if not pays(wait_usd, cost, rc.realized_defrag, 0.0):  # corrected by past defrag moves
        return None
    share = wait_usd / len(moves)  # the gang's avoided wait, attributed evenly to its movers
    return cost, tuple(Move(m.attempt_id, m.job_id, m.from_pool, m.to_pool, m.alloc, 0, share,
                            m.cost_usd, m.reason, m.usd_per_gpu_hour_from, m.usd_per_gpu_hour_to)
                       for m in moves)


def _movable(r: RunningView, j: PendingView, facts: Mapping[int, AttemptFacts], snap: Snapshot,
             busy: frozenset[int]) -> bool:
    return (not r.stopping and r.attempt_id in facts and r.job_id not in busy
            and r.priority.rank <= j.priority.rank
            and snap.now - r.started_at >= snap.config.min_run_s)


def _cheapest_cover(rs: list[RunningView], need: int, cost_of: dict[int, float]
                    ) -> tuple[RunningView, ...] | None:
    """The cheapest subset of rs holding at least `need` GPUs (at most 8 candidates are
    searched exhaustively, the cheapest per GPU first); None if they do not hold enough."""
    if need <= 0:
        return ()
    rs = sorted(rs, key=lambda r: (cost_of[r.attempt_id] / max(1, r.gpus), r.job_id))[:8]
    best: tuple[float, tuple[RunningView, ...]] | None = None
    for k in range(1, len(rs) + 1):
        for combo in combinations(rs, k):
            if sum(r.gpus for r in combo) < need:
                continue
            c = sum(cost_of[r.attempt_id] for r in combo)
            if best is None or c < best[0]:
                best = (c, combo)
    return None if best is None else best[1]

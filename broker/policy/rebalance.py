"""Rebalancing: which running attempts move to cheaper capacity, and where. Pure.

A move is "checkpoint now, wait for the commit, stop, place in B": nobody loses work to it,
and the job only pays the move's overheads. It is proposed for a running attempt in pool A
when, over the attempt's expected remaining run time, the saving exceeds the move's cost:

    hourly_usd(P)  = G x (price_P + risk_P)                     for pool P and G GPUs
    risk_P         = rate_P x lost_h x (price_P + gpu_hour_value_usd)
    lost_h         = (restart_overhead_s + launch_latency_s of P
                      + 0 if checkpoint_on_signal else checkpoint_interval_s / 2) / 3600
    saving_usd     = (hourly_usd(A) - hourly_usd(B)) x remaining_h
    cost_usd       = G x restart_overhead_h x (price_B + gpu_hour_value_usd)   restart in B
                     + G x checkpoint_save_h x price_A                        saving the state
                     + nodes x gpus_per_node_B x launch_latency_h x price_B   if B boots nodes
                     + egress to B's checkpoint store (AttemptFacts.egress_usd, priced by the
                       caller with pricing.egress)

`risk_P` is what interruptions cost per GPU-hour: each reclaim loses the restart, the wait
for a replacement node and (without checkpoint-on-signal) half a checkpoint interval, at
the pool's price plus the value of the work. A spot pool whose interruption rate spikes
therefore becomes dearer than on-demand, and its jobs move off it.

It moves when `saving_usd x r - cost_usd >= min_saving_usd` (and saving x r > cost), where r
(RebalanceConfig.realized_move, at most 1) is what past moves realized per dollar they were
expected to save (broker.policy.rebalance_realized); Move.saving_usd stays the uncorrected
estimate, so what moves realize can be compared with it. Remaining run
time: the job's expected duration minus its progress when known; otherwise as long again as
this attempt has run (a job that just started is never moved on a guess), capped at
`max_remaining_s`.

Who moves (in order of net saving, largest first, at most `max_moves` per round):
- a running attempt, not stopping, that has run at least `PolicyConfig.min_run_s` (no
  thrash), with no move in flight;
- to a pool whose GPU type the job accepts, whose market its spot policy allows, whose
  partition admits its team and whose nodes are big enough;
- onto GPUs the plan of this round leaves free (no placement, no reservation takes them: the
  queue comes first), or onto nodes B may launch (rented pools with room in their quota).

Reasons, in the order they are checked: "interruption rate spike" (A is spot and B costs as
much or more by list price: only A's interruption risk makes the move pay), "on-demand to
freed on-prem", "on-demand to spot", "spot to cheaper spot", "to cheaper capacity".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from broker.policy.rebalance_realized import pays
from broker.policy.snapshot import Alloc, Plan, PoolView, RunningView, Snapshot
from broker.spec import Market, SpotPolicy, market_ok


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """Knobs of rebalancing (onepool.yaml `broker.rebalance`; defaults by principle, see
    broker.spec.RebalanceSettings)."""

    min_saving_usd: float = 1.0
    max_moves: int = 4
    max_remaining_s: float = 7 * 86400.0
    checkpoint_save_s: float = 60.0
    defrag_after_s: float = 1800.0  # a gang must have waited this long before others move for it
    # what past moves realized per dollar expected, by kind (broker.policy.rebalance_realized):
    # a move's expected saving is scaled by it before it is weighed against its cost
    realized_move: float = 1.0
    realized_defrag: float = 1.0


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What the policy needs to know of a running attempt beyond its RunningView."""

    pool: str
    spot: SpotPolicy = SpotPolicy.ALLOWED
    gpu_types: tuple[str, ...] = ()
    remaining_s: float | None = None  # expected remaining run time; None: unknown
    checkpoint_interval_s: float = 1800.0
    egress_usd: tuple[tuple[str, float], ...] = ()  # (pool, USD to copy its checkpoint there)

    def egress_to(self, pool: str) -> float:
        return next((usd for p, usd in self.egress_usd if p == pool), 0.0)


@dataclass(frozen=True, slots=True)
class Move:
    """Move one running attempt to `alloc` in `to_pool` (alloc empty: B launches `launch`
    nodes for it first). Money in USD over the attempt's expected remaining run time."""

    attempt_id: int
    job_id: int
    from_pool: str
    to_pool: str
    alloc: Alloc
    launch: int
    saving_usd: float
    cost_usd: float
    reason: str
    usd_per_gpu_hour_from: float = 0.0
    usd_per_gpu_hour_to: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {"job": self.job_id, "attempt": self.attempt_id, "from_pool": self.from_pool,
                "to_pool": self.to_pool, "saving_usd": round(self.saving_usd, 4),
                "cost_usd": round(self.cost_usd, 4), "reason": self.reason,
                "launch_nodes": self.launch}


def free_after(snap: Snapshot, p: Plan, keep_for: int | None = None) -> dict[str, int]:
    """Free GPUs per node once this round's plan is applied: capacity minus running attempts,
    placements and reservations (except the reservation of job `keep_for`)."""
    free = {nd.id: nd.gpus for pool in snap.pools for nd in pool.nodes}
    for r in snap.running:
        for node, g in r.alloc:
            free[node] = free.get(node, 0) - g
    for pl in p.placements:
        for node, g in pl.alloc:
            free[node] = free.get(node, 0) - g
    for jid, alloc in p.reservations:
        if jid != keep_for:
            for node, g in alloc:
                free[node] = free.get(node, 0) - g
    return free


def pool_of(snap: Snapshot) -> dict[str, str]:
    return {nd.id: pool.name for pool in snap.pools for nd in pool.nodes}


def hourly_usd(pool: PoolView, gpus: int, facts: AttemptFacts, snap: Snapshot) -> float:
    """USD per hour of running `gpus` GPUs in `pool`, interruption risk included."""
    cfg = snap.config
    lost_s = cfg.restart_overhead_s + pool.launch_latency_s
    if not cfg.checkpoint_on_signal:
        lost_s += facts.checkpoint_interval_s / 2
    risk = pool.interruption_rate_per_h * lost_s / 3600.0 * (pool.price_per_gpu_hour
                                                             + cfg.gpu_hour_value_usd)
    return gpus * (pool.price_per_gpu_hour + risk)


def remaining_s(r: RunningView, facts: AttemptFacts, now: float, rc: RebalanceConfig) -> float:
    """Expected remaining run time (see the module docstring)."""
    if facts.remaining_s is not None:
        return max(0.0, min(facts.remaining_s, rc.max_remaining_s))
    return max(0.0, min(now - r.started_at, rc.max_remaining_s))


def move_cost(r: RunningView, a: PoolView, b: PoolView, facts: AttemptFacts, launch: int,
              snap: Snapshot, rc: RebalanceConfig) -> float:
    """What moving r from a to b costs in USD (see the module docstring)."""
    cfg = snap.config
    cost = r.gpus * cfg.restart_overhead_s / 3600.0 * (b.price_per_gpu_hour + cfg.gpu_hour_value_usd)
    cost += r.gpus * rc.checkpoint_save_s / 3600.0 * a.price_per_gpu_hour
    cost += launch * b.gpus_per_node * b.launch_latency_s / 3600.0 * b.price_per_gpu_hour
    return cost + facts.egress_to(b.name)


def reason_for(a: PoolView, b: PoolView) -> str:
    """Why a move from a to b pays (b is cheaper once interruption risk is counted)."""
    if a.market is Market.SPOT and b.price_per_gpu_hour >= a.price_per_gpu_hour:
        return "interruption rate spike"  # dearer by list price: only a's risk makes it pay
    if a.market is Market.ON_DEMAND and b.market is Market.ONPREM:
        return "on-demand to freed on-prem"
    if a.market is Market.ON_DEMAND and b.market is Market.SPOT:
        return "on-demand to spot"
    if a.market is Market.SPOT and b.market is Market.SPOT:
        return "spot to cheaper spot"
    return "to cheaper capacity"


def fit(nodes: list[str], free: dict[str, int], gpn: int, count: int) -> Alloc | None:
    """`count` nodes with gpn free GPUs each, best fit (fullest first, then id); None if not."""
    ok = sorted((nd for nd in nodes if free.get(nd, 0) >= gpn), key=lambda nd: (free[nd], nd))
    if len(ok) < count:
        return None
    return tuple((nd, gpn) for nd in ok[:count])


def rebalance(snap: Snapshot, p: Plan, facts: Mapping[int, AttemptFacts],
              rc: RebalanceConfig = RebalanceConfig(), busy: frozenset[int] = frozenset()
              ) -> tuple[Move, ...]:
    """The moves worth making now (see the module docstring). `facts` per attempt id (an
    attempt without facts is not moved); `busy`: job ids with a move in flight.
    Deterministic; nothing is mutated."""
    now, cfg = snap.now, snap.config
    pools = {pl.name: pl for pl in snap.pools}
    free = free_after(snap, p)
    launchable = {pl.name: pl.launchable for pl in snap.pools if pl.max_nodes is not None}
    cands: list[tuple[float, int, Move]] = []
    for r in snap.running:
        f = facts.get(r.attempt_id)
        if (f is None or r.stopping or r.job_id in busy or now - r.started_at < cfg.min_run_s
                or f.pool not in pools):
            continue
        a = pools[f.pool]
        rem_h = remaining_s(r, f, now, rc) / 3600.0
        if rem_h <= 0:
            continue
        gpn, n = r.alloc[0][1], len(r.alloc)
        here = hourly_usd(a, r.gpus, f, snap)
        for b in snap.pools:
            if (b.name == a.name or (f.gpu_types and b.gpu_type not in f.gpu_types)
                    or not market_ok(f.spot, b.market) or b.gpus_per_node < gpn
                    or (b.teams is not None and r.team not in b.teams)):
                continue
            there = hourly_usd(b, r.gpus, f, snap)
            if there >= here:
                continue
            alloc = fit([nd.id for nd in b.nodes], free, gpn, n)
            launch = 0
            if alloc is None:
                if launchable.get(b.name, 0) < n:
                    continue
                alloc, launch = (), n
            saving = (here - there) * rem_h
            cost = move_cost(r, a, b, f, launch, snap, rc)
            if not pays(saving, cost, rc.realized_move, rc.min_saving_usd):
                continue
            mv = Move(r.attempt_id, r.job_id, a.name, b.name, alloc, launch, saving, cost,
                      reason_for(a, b), here / r.gpus, there / r.gpus)
            cands.append((-(saving * rc.realized_move - cost), r.attempt_id, mv))
    cands.sort(key=lambda c: (c[0], c[1], c[2].to_pool))
    out: list[Move] = []
    moved: set[int] = set()
    taken: dict[str, int] = defaultdict(int)
    for _, aid, mv in cands:
        if aid in moved or len(out) >= rc.max_moves:
            continue
        if mv.launch:
            if launchable[mv.to_pool] - taken[mv.to_pool] < mv.launch:
                continue
            taken[mv.to_pool] += mv.launch
        else:
            if any(free.get(nd, 0) < g for nd, g in mv.alloc):
                # the GPUs were taken by a better move: look again on what is left
                b = pools[mv.to_pool]
                r = next(x for x in snap.running if x.attempt_id == aid)
                alloc = fit([nd.id for nd in b.nodes], free, r.alloc[0][1], len(r.alloc))
                if alloc is None:
                    continue
                mv = _with_alloc(mv, alloc)
            for nd, g in mv.alloc:
                free[nd] -= g
        moved.add(aid)
        out.append(mv)
    return tuple(out)


def _with_alloc(mv: Move, alloc: Alloc) -> Move:
    return replace(mv, alloc=alloc)

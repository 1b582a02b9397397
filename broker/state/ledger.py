"""The cost ledger: every node-second on the meter, written with the price in force.

Contract:

- A node is on the meter from `node_up(...)` (a rented launch, at its launch time) or, for
  nodes the config creates (on-prem, local), from the first `accrue()` that sees it up, until
  `node_down(...)` (terminate) or until `accrue()` sees it retired. Nothing before or after is
  charged; nothing in between is charged twice (`NodeMeter.metered_to` is the high-water mark).
- The price in force at time t for a pool is the newest `price_changed(pool, usd, at)` with
  at <= t, else the pool's configured `price_per_node_hour`. Rented pools are charged that
  price per node-hour split evenly over the node's GPUs. On-prem pools are charged their
  amortized `amortized_usd_per_gpu_hour` (else the node price / GPUs): shown, never used for
  placement.
- Each job is charged its share of the node: the GPUs its attempt holds there, for the time it
  held them. GPUs nobody held are "idle" rows, charged to the pool, or, with
  `broker.idle_charged_to: launcher`, to the team whose job triggered the launch. Slurm pools
  (shared with the cluster's other users) have no idle rows: only onepool's jobs are charged.
- Checkpoint egress (bytes copied across stores for an attempt) is one "egress" row per attempt.
- Rows are extended in place while nothing changes (same node, payer, GPUs, price), so a
  long-running job is one row per price period, not one per cycle.

All functions take an open Session and leave committing to the caller.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from sqlmodel import Session, col, or_, select

from broker.spec import BrokerSettings, ClusterConfig, Market
from broker.state.model import Attempt, Job, LedgerEntry, Node, NodeMeter, NodeState, Pool, PriceChange

# Pools whose nodes others use too (a Slurm partition): only onepool's GPU-seconds are charged.
SHARED_PROVIDERS = ("slurm",)
METERED = (NodeState.UP, NodeState.UNAVAILABLE)

__all__ = ["accrue", "node_down", "node_up", "price_changed", "price_in_force", "usd_per_gpu_hour"]


def price_changed(s: Session, pool: str, usd_per_node_hour: float, at: float) -> None:
    """Record that `pool`'s node-hour costs `usd_per_node_hour` from `at` on (a spot price
    move, a re-priced offer). Raises ValueError for a negative price."""
    if usd_per_node_hour < 0:
        raise ValueError(f"a price cannot be negative (got {usd_per_node_hour} for pool {pool})")
    s.add(PriceChange(pool=pool, at=at, usd_per_node_hour=usd_per_node_hour))
    s.flush()


def price_in_force(s: Session, pool: Pool, at: float) -> float:
    """USD per node-hour of `pool` at time `at`."""
    row = s.exec(select(PriceChange).where(PriceChange.pool == pool.name, PriceChange.at <= at)
                 .order_by(col(PriceChange.at).desc(), col(PriceChange.id).desc())).first()
    return pool.price_per_node_hour if row is None else row.usd_per_node_hour


def usd_per_gpu_hour(pool: Pool, usd_per_node_hour: float, cfg: ClusterConfig | None) -> float:
    """What one GPU-hour of `pool` is charged, given the node-hour price in force."""
    if pool.market == Market.ONPREM.value and cfg is not None:
        spec = next((p for p in cfg.pools if p.name == pool.name), None)
        if spec is not None and spec.amortized_usd_per_gpu_hour is not None:
            return spec.amortized_usd_per_gpu_hour
    return usd_per_node_hour / max(1, pool.gpus_per_node)


def node_up(s: Session, node: str, pool: str, gpus: int, at: float,
            launched_for_team: str | None = None) -> NodeMeter:
    """Put a node on the meter from `at` (its launch). Idempotent: an open meter is returned."""
    open_ = _open_meter(s, node)
    if open_ is not None:
        return open_
    m = NodeMeter(node=node, pool=pool, gpus=gpus, started_at=at, metered_to=at,
                  launched_for_team=launched_for_team)
    s.add(m)
    s.flush()
    return m


def node_down(s: Session, node: str, at: float, cfg: ClusterConfig | None = None) -> None:
    """Charge the node up to `at` (its termination) and take it off the meter. A node that is
    not on the meter is ignored (terminate of a gone node is quiet)."""
    m = _open_meter(s, node)
    if m is None:
        return
    _charge(s, m, max(m.metered_to, at), cfg)
    m.ended_at = max(m.metered_to, at)
    s.add(m)
    s.flush()


def accrue(s: Session, now: float, cfg: ClusterConfig | None = None) -> None:
    """Charge every node on the meter up to `now`; start metering config nodes that came up,
    stop metering ones retired; write egress rows for attempts that copied checkpoints."""
    pools = {p.name: p for p in s.exec(select(Pool)).all()}
    metered = {m.node: m for m in s.exec(select(NodeMeter).where(col(NodeMeter.ended_at).is_(None)))}
    for n in s.exec(select(Node)).all():
        # A Slurm node drained or down (unavailable) stays on the meter: work may still run there.
        up = n.state in METERED and pools.get(n.pool) is not None and pools[n.pool].active
        m = metered.get(n.id)
        if up and m is None:
            metered[n.id] = node_up(s, n.id, n.pool, n.gpus, now)
        elif not up and m is not None:
            node_down(s, n.id, now, cfg)
            del metered[n.id]
    for m in metered.values():
        _charge(s, m, now, cfg)
    _egress(s)
    s.flush()


def _open_meter(s: Session, node: str) -> NodeMeter | None:
    return s.exec(select(NodeMeter).where(NodeMeter.node == node,
                                          col(NodeMeter.ended_at).is_(None))).first()


def _charge(s: Session, m: NodeMeter, until: float, cfg: ClusterConfig | None) -> None:
    """Write [m.metered_to, until] of node m into the ledger and advance the meter."""
    t0 = m.metered_to
    if until <= t0:
        return
    pool = s.get(Pool, m.pool)
    if pool is None:  # a meter for a pool the config never had: nothing to price it with
        m.metered_to = until
        s.add(m)
        return
    settings = cfg.broker if cfg is not None else BrokerSettings()
    held = _holders(s, m, t0, until)
    bounds = {t0, until}
    for ch in s.exec(select(PriceChange.at).where(PriceChange.pool == m.pool, PriceChange.at > t0,
                                                  PriceChange.at < until)).all():
        bounds.add(ch)
    for a, _job, _g in held:
        bounds.update(t for t in (a.started_at, a.ended_at) if t is not None and t0 < t < until)
    open_rows = {(r.attempt_id, r.kind): r for r in s.exec(
        select(LedgerEntry).where(LedgerEntry.node == m.node, LedgerEntry.end == t0))}
    idle_team = m.launched_for_team if settings.idle_charged_to == "launcher" else None
    edges = sorted(bounds)
    for a_t, b_t in itertools.pairwise(edges):
        rate = usd_per_gpu_hour(pool, price_in_force(s, pool, a_t), cfg)
        used = 0
        for a, job, g in held:
            end = a.ended_at if a.ended_at is not None else until
            if a.started_at <= a_t and end >= b_t:
                used += g
                _add(s, open_rows, m, "gpu", a_t, b_t, g, rate, attempt=a, job=job)
        idle = max(0, m.gpus - used)
        if idle and pool.provider not in SHARED_PROVIDERS:
            _add(s, open_rows, m, "idle", a_t, b_t, idle, rate, team=idle_team)
    m.metered_to = until
    s.add(m)


def _holders(s: Session, m: NodeMeter, t0: float, t1: float) -> list[tuple[Attempt, Job, int]]:
    """Attempts holding GPUs of node m at some time in [t0, t1], with their GPU count there."""
    rows = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id).where(
        Attempt.pool == m.pool, Attempt.started_at < t1,
        or_(col(Attempt.ended_at).is_(None), col(Attempt.ended_at) > t0))).all()
    out = []
    for a, j in rows:
        g = sum(len(slots) for node, slots in a.alloc if node == m.node)
        if g:
            out.append((a, j, g))
    return out


def _add(s: Session, open_rows: dict[tuple[int | None, str], LedgerEntry], m: NodeMeter, kind: str,
         start: float, end: float, gpus: int, rate: float, *, attempt: Attempt | None = None,
         job: Job | None = None, team: str | None = None) -> None:
    usd = gpus * (end - start) * rate / 3600.0
    key = (attempt.id if attempt else None, kind)
    row = open_rows.get(key)
    if row is not None and row.end == start and row.gpus == gpus and row.usd_per_gpu_hour == rate:
        row.end, row.usd = end, row.usd + usd
    else:
        row = LedgerEntry(kind=kind, pool=m.pool, node=m.node, start=start, end=end, gpus=gpus,
                          usd_per_gpu_hour=rate, usd=usd,
                          job_id=job.id if job else None, attempt_id=key[0],
                          team=job.team if job else team, experiment=job.experiment if job else None)
    s.add(row)
    open_rows[key] = row


def _egress(s: Session) -> None:
    charged = select(LedgerEntry.attempt_id).where(LedgerEntry.kind == "egress")
    rows = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id).where(
        Attempt.egress_usd > 0, col(Attempt.id).not_in(charged))).all()
    for a, j in rows:
        s.add(LedgerEntry(kind="egress", pool=a.pool, job_id=j.id, attempt_id=a.id, team=j.team,
                          experiment=j.experiment, start=a.started_at, end=a.started_at,
                          usd=a.egress_usd))


def spend_by_job(s: Session, job_ids: list[int]) -> dict[int, float]:
    """USD charged so far to each job (GPU shares and egress)."""
    out: dict[int, float] = defaultdict(float)
    if job_ids:
        for jid, usd in s.exec(select(LedgerEntry.job_id, LedgerEntry.usd)
                               .where(col(LedgerEntry.job_id).in_(job_ids))):
            out[jid] += usd
    return dict(out)

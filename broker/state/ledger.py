"""The cost ledger: every node-second on the meter, written with the price in force.

Contract:

- A rented node is on the meter from the cloud's answer to its launch (the cloud bills from
  then) to its confirmed termination: the capacity manager calls `node_up` in the
  transaction that writes the node's instance id,
  `node_ready` when it is up, `node_draining` on an interruption notice or the decision to
  give it back, and `node_down` in the transaction that records it terminated (or lost, or
  refused by the cloud). Nodes the config creates (on-prem, local) are on the meter from the
  first `accrue()` that sees them up until one sees them retired. Nothing before or after is
  charged; nothing in between is charged twice (`NodeMeter.metered_to` is the high-water mark).
- Every second of a metered node's GPUs is one of: "gpu" (held by an attempt: charged to its
  job), "boot" (a rented node before it is ready), "idle" (up, nobody's), "drain" (after an
  interruption notice or the decision to give it back, until the cloud confirms the end).
  Unused time is charged to the pool, or with `broker.idle_charged_to: launcher` to the team
  whose job triggered the launch.
- The price in force at time t for a pool is the newest `price_changed(pool, usd, at)` with
  at <= t, else its list price: the configured `price_per_node_hour`, else (rented pools) the
  catalog's for its provider, region, instance type, market and zone. The capacity manager
  records the catalog price when it first prices a pool and every change after. A rented pool
  neither prices raises `Unpriced`: it is never free. Rented pools are charged that price per
  node-hour split evenly over the node's GPUs; on-prem pools their amortized rate
  (`amortize`: purchase price, years, power, hosting; or `amortized_usd_per_gpu_hour`; else
  the node price / GPUs), shown, never used for placement.
- Checkpoint egress (bytes copied across stores for an attempt) is one "egress" row per
  attempt; checkpoint storage is one "storage" row per checkpoint (broker.state.storage_ledger),
  both charged to the job (and experiment) whose checkpoint it is.
- Slurm pools (shared with the cluster's other users) have no idle rows: only onepool's
  jobs are charged.
- Rows are extended in place while nothing changes (same node, payer, GPUs, price), so a
  long-running job is one row per price period, not one per cycle.

All functions take an open Session and leave committing to the caller.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping
from functools import cache

from sqlmodel import Session, col, or_, select

from broker.errors import Unpriced
from broker.spec import BrokerSettings, ClusterConfig, Market, PoolSpec
from broker.state.model import Attempt, Job, LedgerEntry, Node, NodeMeter, NodeState, Pool, PriceChange
from pricing.catalog import Catalog, CatalogOffer

# Pools whose nodes others use too (a Slurm partition): only onepool's GPU-seconds are charged.
SHARED_PROVIDERS = ("slurm",)
METERED = (NodeState.UP, NodeState.UNAVAILABLE)

__all__ = ["KINDS", "UNUSED", "accrue", "catalog_offer", "list_price", "node_down", "node_draining",
           "node_ready", "node_up", "price_changed", "price_in_force", "spend_by_job", "usd_per_gpu_hour"]

KINDS = ("gpu", "boot", "idle", "drain", "egress", "storage")
UNUSED = ("boot", "idle", "drain")  # GPUs paid for and nobody's work


# -- prices -----------------------------------------------------------------------------------
@cache
def _snapshot() -> Catalog:
    return Catalog.snapshot()


def catalog_offer(spec: PoolSpec, catalog: Catalog | None = None,
                  zone_ids: Mapping[str, str] | None = None) -> CatalogOffer:
    """The catalog's offer for a rented pool (see pricing.catalog.Catalog.find for zones).
    Raises Unpriced naming what was looked up."""
    hit = (catalog or _snapshot()).find(spec.provider, spec.region, spec.instance_type or "",
                                       spec.market.value, spec.zone, zone_ids)
    if hit is None:
        where = f"{spec.provider} {spec.region}" + (f" zone {spec.zone}" if spec.zone else "")
        raise Unpriced(f"pool {spec.name}: the price catalog has no {spec.market.value} offer for "
                       f"{spec.instance_type} in {where}; set price_per_node_hour for it in onepool.yaml")
    return hit


def list_price(spec: PoolSpec, catalog: Catalog | None = None,
               zone_ids: Mapping[str, str] | None = None) -> float:
    """USD per node-hour of a pool before any recorded change: its `price_per_node_hour`, else
    (rented pools) the catalog's. Raises Unpriced for a rented pool neither prices."""
    if spec.price_per_node_hour or not spec.rented:
        return spec.price_per_node_hour
    return catalog_offer(spec, catalog, zone_ids).usd_per_hour


def price_changed(s: Session, pool: str, usd_per_node_hour: float, at: float) -> None:
    """Record that `pool`'s node-hour costs `usd_per_node_hour` from `at` on (a spot price
    move, a re-priced offer). Raises ValueError for a negative price."""
    if usd_per_node_hour < 0:
        raise ValueError(f"a price cannot be negative (got {usd_per_node_hour} for pool {pool})")
    s.add(PriceChange(pool=pool, at=at, usd_per_node_hour=usd_per_node_hour))
    s.flush()


def recorded_price(s: Session, pool: str, at: float | None = None) -> float | None:
    """The newest recorded price of `pool` (at or before `at`), None if none was recorded."""
    q = select(PriceChange.usd_per_node_hour).where(PriceChange.pool == pool)
    if at is not None:
        q = q.where(PriceChange.at <= at)
    return s.exec(q.order_by(col(PriceChange.at).desc(), col(PriceChange.id).desc())).first()


def price_in_force(s: Session, pool: Pool, at: float, cfg: ClusterConfig | None = None) -> float:
    """USD per node-hour of `pool` at time `at`. Raises Unpriced (see list_price)."""
    recorded = recorded_price(s, pool.name, at)
    if recorded is not None:
        return recorded
    spec = _spec(cfg, pool.name)
    return pool.price_per_node_hour if spec is None else list_price(spec)


def usd_per_gpu_hour(pool: Pool, usd_per_node_hour: float, cfg: ClusterConfig | None) -> float:
    """What one GPU-hour of `pool` is charged, given the node-hour price in force."""
    spec = _spec(cfg, pool.name)
    if pool.market == Market.ONPREM.value and spec is not None:
        if spec.amortize is not None:
            from pricing.cost import amortized_usd_per_gpu_hour

            a = spec.amortize
            return amortized_usd_per_gpu_hour(a.purchase_usd_per_node, a.years, spec.gpus_per_node,
                                              a.power_usd_per_gpu_hour, a.hosting_usd_per_gpu_hour)
        if spec.amortized_usd_per_gpu_hour is not None:
            return spec.amortized_usd_per_gpu_hour
    return usd_per_node_hour / max(1, pool.gpus_per_node)


def _spec(cfg: ClusterConfig | None, pool: str) -> PoolSpec | None:
    return None if cfg is None else next((p for p in cfg.pools if p.name == pool), None)


# -- the node meter ---------------------------------------------------------------------------
def node_up(s: Session, node: str, pool: str, gpus: int, at: float,
            launched_for_team: str | None = None, *, rented: bool = False) -> NodeMeter:
    """Put a node on the meter from `at`. A rented node (`rented=True`: its launch answered)
    boots until `node_ready`; other nodes are ready at once. Idempotent: an open meter is
    returned as it is."""
    open_ = _open_meter(s, node)
    if open_ is not None:
        return open_
    m = NodeMeter(node=node, pool=pool, gpus=gpus, started_at=at, metered_to=at,
                  launched_for_team=launched_for_team, rented=rented,
                  ready_at=None if rented else at)
    s.add(m)
    s.flush()
    return m


def node_ready(s: Session, node: str, at: float) -> float:
    """The node is up: its boot ends at `at`, or where the meter already charged it as booting
    (a cycle that charged past `at` before this was written). Returns when its boot ended (`at`
    for a node not on the meter or already ready)."""
    m = _open_meter(s, node)
    if m is None:
        return at
    if m.ready_at is None:
        m.ready_at = max(at, m.started_at, m.metered_to)
        s.add(m)
    return m.ready_at


def node_draining(s: Session, node: str, at: float) -> None:
    """The node drains from `at` (an interruption notice, or the decision to give it back):
    its unused GPUs are "drain" until `node_down`. Ignored when not metered or already draining."""
    m = _open_meter(s, node)
    if m is not None and m.drain_at is None:
        m.drain_at = max(at, m.started_at, m.metered_to)  # what was charged stays charged
        s.add(m)


def node_down(s: Session, node: str, at: float, cfg: ClusterConfig | None = None) -> None:
    """Charge the node up to `at` (its confirmed termination) and take it off the meter. A node
    that is not on the meter is ignored (terminate of a gone node is quiet)."""
    m = _open_meter(s, node)
    if m is None:
        return
    _charge(s, m, max(m.metered_to, at), cfg)
    m.ended_at = max(m.metered_to, at)
    s.add(m)
    s.flush()


def accrue(s: Session, now: float, cfg: ClusterConfig | None = None) -> None:
    """Charge every node on the meter up to `now`; start metering config nodes that came up,
    stop metering ones retired (rented nodes are left to the capacity manager's hooks); write
    egress rows for attempts that copied checkpoints and storage rows for checkpoints kept."""
    from broker.state.storage_ledger import accrue_storage

    pools = {p.name: p for p in s.exec(select(Pool)).all()}
    metered = {m.node: m for m in s.exec(select(NodeMeter).where(col(NodeMeter.ended_at).is_(None)))}
    for n in s.exec(select(Node).where(col(Node.token).is_(None))).all():
        # A Slurm node drained or down (unavailable) stays on the meter: work may still run there.
        up = n.state in METERED and pools.get(n.pool) is not None and pools[n.pool].active
        m = metered.get(n.id)
        if up and m is None:
            metered[n.id] = node_up(s, n.id, n.pool, n.gpus, now)
        elif not up and m is not None and not m.rented:
            node_down(s, n.id, now, cfg)
            del metered[n.id]
    held = _holders_by_node(s, list(metered.values()), now)
    for m in metered.values():
        _charge(s, m, now, cfg, held.get(m.node, []))
    _egress(s)
    accrue_storage(s, now)
    s.flush()


def _open_meter(s: Session, node: str) -> NodeMeter | None:
    return s.exec(select(NodeMeter).where(NodeMeter.node == node,
                                          col(NodeMeter.ended_at).is_(None))).first()


def _phase(m: NodeMeter, t: float) -> str:
    """What unused GPUs of node m are at time t: boot, idle or drain."""
    if m.ready_at is None or t < m.ready_at:
        return "boot"
    if m.drain_at is not None and t >= m.drain_at:
        return "drain"
    return "idle"


def _charge(s: Session, m: NodeMeter, until: float, cfg: ClusterConfig | None,
            holders: list[tuple[Attempt, Job, int]] | None = None) -> None:
    """Write [m.metered_to, until] of node m into the ledger and advance the meter.
    `holders`: the attempts that may hold GPUs of m in that window (read here if None)."""
    t0 = m.metered_to
    if until <= t0:
        return
    pool = s.get(Pool, m.pool)
    if pool is None:  # a meter for a pool the config never had: nothing to price it with
        m.metered_to = until
        s.add(m)
        return
    settings = cfg.broker if cfg is not None else BrokerSettings()
    held = _holders(s, m, t0, until) if holders is None else [
        (a, j, g) for a, j, g in holders
        if a.started_at < until and (a.ended_at is None or a.ended_at > t0)]
    bounds = {t0, until}
    for ch in s.exec(select(PriceChange.at).where(PriceChange.pool == m.pool, PriceChange.at > t0,
                                                  PriceChange.at < until)).all():
        bounds.add(ch)
    bounds.update(t for t in (m.ready_at, m.drain_at) if t is not None and t0 < t < until)
    for a, _job, _g in held:
        bounds.update(t for t in (a.started_at, a.ended_at) if t is not None and t0 < t < until)
    open_rows = {(r.attempt_id, r.kind): r for r in s.exec(
        select(LedgerEntry).where(LedgerEntry.node == m.node, LedgerEntry.end == t0))}
    unused_team = m.launched_for_team if settings.idle_charged_to == "launcher" else None
    for a_t, b_t in itertools.pairwise(sorted(bounds)):
        rate = usd_per_gpu_hour(pool, price_in_force(s, pool, a_t, cfg), cfg)
        used = 0
        for a, job, g in held:
            end = a.ended_at if a.ended_at is not None else until
            if a.started_at <= a_t and end >= b_t:
                used += g
                _add(s, open_rows, m, "gpu", a_t, b_t, g, rate, attempt=a, job=job)
        unused = max(0, m.gpus - used)
        if unused and pool.provider not in SHARED_PROVIDERS:
            _add(s, open_rows, m, _phase(m, a_t), a_t, b_t, unused, rate, team=unused_team)
    m.metered_to = until
    s.add(m)


def _holders_by_node(s: Session, meters: list[NodeMeter], until: float
                     ) -> dict[str, list[tuple[Attempt, Job, int]]]:
    """For each metered node: the attempts holding GPUs there at some time in [its meter's
    high-water mark, until], with their GPU count there; one query for every meter."""
    if not meters:
        return {}
    t0 = min(m.metered_to for m in meters)
    nodes = {m.node for m in meters}
    out: dict[str, list[tuple[Attempt, Job, int]]] = {}
    for a, j in s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id).where(
            col(Attempt.pool).in_({m.pool for m in meters}), Attempt.started_at < until,
            or_(col(Attempt.ended_at).is_(None), col(Attempt.ended_at) > t0))).all():
        per_node: dict[str, int] = {}
        for node, slots in a.alloc:
            if node in nodes:
                per_node[node] = per_node.get(node, 0) + len(slots)
        for node, g in per_node.items():
            if g:
                out.setdefault(node, []).append((a, j, g))
    return out


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
    """USD charged so far to each job (GPU shares, egress and checkpoint storage)."""
    out: dict[int, float] = defaultdict(float)
    if job_ids:
        for jid, usd in s.exec(select(LedgerEntry.job_id, LedgerEntry.usd)
                               .where(col(LedgerEntry.job_id).in_(job_ids))):
            out[jid] += usd
    return dict(out)

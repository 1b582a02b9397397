"""Renting: which offer a blocked job gets, the preempt-or-buy rule, and scale-down. Pure.

Offers. A rented pool can take a job if its GPU type is acceptable, its market is allowed by
the job's spot policy, its partition admits the team, its nodes are big enough, its quota
has room for the job's nodes, and the job's remaining budget covers the rental. Offers are
ranked by effective price (pricing.cost.effective_price: price x (1 + expected rework from
spot interruptions, the job's checkpoint interval and the restart overhead)), then name.

Spot capacity that comes back. A spot pool that refused a launch is closed for a while
(broker.policy.pools); a spot pool at its quota (`max_nodes`, big enough for the job) frees a
slot when one of its nodes is released. Either way, work below high that may run on spot
then takes only spot offers (another spot pool, or this one when it reopens or has room)
rather than renting on demand at several times the price: it waits for spot as it waits for
on-prem GPUs. On-demand is for high/urgent work, which takes the next offer at once, and
for work that may not run on spot. The same work alone is placed on rented on-demand nodes
already up (broker.policy.plan, candidate pools): other work would keep a node launched for
an urgent job rented at the on-demand price, each placement restarting its idle timeout.

When. A blocked job that could not be placed and has no victims stopping for it rents:
- high/urgent jobs: at once, when the preempt-or-buy rule says buy, or when there is
  nothing to preempt;
- other classes: after waiting `cloud_after_wait_s` since submission (so a minute of queue
  does not buy a node), and only when nothing can be preempted for them.

Preempt-or-buy, for a high/urgent job that has both a victim set and an offer:

    preempt_usd = lost_gpu_h(victims) * gpu_hour_value_usd
                  + grace_s/3600 * job GPUs * wait_value_usd_per_gpu_hour
    buy_usd     = effective_price * job GPUs * horizon_h
                  + launch_latency_s/3600 * job GPUs * wait_value_usd_per_gpu_hour

where lost_gpu_h counts each victim's restart overhead, plus its work since its last
checkpoint for the share of victims assumed not to checkpoint on the signal
(1 - checkpoint_on_signal), and horizon_h is the job's expected
duration (or rent_horizon_s). Buy iff buy_usd < preempt_usd.

Packing. Nodes already launching for a job with spare GPUs (a 1-GPU job on an 8-GPU node)
take single-node jobs waiting for capacity of that pool, before anything new is launched.

Scale-down. A rented node with nothing running or held on it, idle for its pool's
`idle_timeout_s`, is given back.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.policy.config import PolicyConfig
from broker.policy.reclaim_index import lost_gpu_s
from broker.policy.snapshot import PendingView, PoolView, RunningView
from broker.spec import Market, SpotPolicy, market_ok
from pricing.cost import effective_price


def offer_price(p: PoolView, j: PendingView, cfg: PolicyConfig) -> float:
    """Effective USD per GPU-hour of useful work for job j on pool p."""
    return effective_price(p.price_per_gpu_hour, p.interruption_rate_per_h,
                           j.checkpoint_interval_s, cfg.restart_overhead_s,
                           cfg.checkpoint_on_signal)


def horizon_h(j: PendingView, cfg: PolicyConfig) -> float:
    return (j.expected_duration_s or cfg.rent_horizon_s) / 3600.0


def offers(j: PendingView, pools: Iterable[PoolView], cfg: PolicyConfig,
           launched: dict[str, int], wait_for_spot: bool = False) -> list[tuple[float, PoolView]]:
    """Rented pools that can take job j now, cheapest effective price first.

    `launched` counts nodes this plan already launches per pool (they use up quota). With
    `wait_for_spot` (work below high), only spot offers while a spot pool that could take the
    job cannot now (closed, or at its quota: see the module docstring): no on-demand rental
    for it meanwhile.
    """
    pools = list(pools)
    if wait_for_spot and j.spot is not SpotPolicy.NEVER and any(
            _spot_later(j, p, launched) for p in pools):
        pools = [p for p in pools if p.market is Market.SPOT]  # other spot pools still do
    out = []
    for p in pools:
        if p.max_nodes is None or p.launchable - launched.get(p.name, 0) < j.nodes:
            continue
        if (j.gpu_types and p.gpu_type not in j.gpu_types) or not market_ok(j.spot, p.market):
            continue
        if (p.teams is not None and j.team not in p.teams) or p.gpus_per_node < j.gpus_per_node:
            continue
        price = offer_price(p, j, cfg)
        if j.budget_usd is not None and p.price_per_gpu_hour * j.gpus * horizon_h(j, cfg) > j.budget_usd:
            continue
        out.append((price, p))
    out.sort(key=lambda o: (o[0], o[1].name))
    return out


def _spot_later(j: PendingView, p: PoolView, launched: dict[str, int]) -> bool:
    """Whether spot pool p could take job j, but not now: it is closed (a stock-out), or its
    quota, big enough for the job, is used up."""
    if p.market is not Market.SPOT or not _fits(j, p):
        return False
    if p.closed:
        return True
    return (p.max_nodes or 0) >= j.nodes and p.launchable - launched.get(p.name, 0) < j.nodes


def _fits(j: PendingView, p: PoolView) -> bool:
    """Whether the pool could take the job at all (its size while closed is capped: unused)."""
    return ((not j.gpu_types or p.gpu_type in j.gpu_types) and (p.teams is None or j.team in p.teams)
            and p.gpus_per_node >= j.gpus_per_node)


def victims_loss_gpu_h(victims: Iterable[RunningView], now: float, cfg: PolicyConfig) -> float:
    """GPU-hours a preemption is expected to destroy: restart overhead, plus un-checkpointed
    work for the share of victims that do not checkpoint on the signal."""
    unsaved = 1.0 - cfg.checkpoint_on_signal
    total = 0.0
    for r in victims:
        total += cfg.restart_overhead_s * r.gpus
        if unsaved:
            total += unsaved * lost_gpu_s(r, now)
    return total / 3600.0


def preempt_usd(victims: Iterable[RunningView], j: PendingView, now: float,
                cfg: PolicyConfig) -> float:
    return (victims_loss_gpu_h(victims, now, cfg) * cfg.gpu_hour_value_usd
            + cfg.grace_s / 3600.0 * j.gpus * cfg.wait_value_usd_per_gpu_hour)


def buy_usd(price: float, p: PoolView, j: PendingView, cfg: PolicyConfig) -> float:
    return (price * j.gpus * horizon_h(j, cfg)
            + p.launch_latency_s / 3600.0 * j.gpus * cfg.wait_value_usd_per_gpu_hour)


def should_buy(victims: Iterable[RunningView], offer: tuple[float, PoolView], j: PendingView,
               now: float, cfg: PolicyConfig) -> bool:
    """The preempt-or-buy rule (see the module docstring)."""
    price, p = offer
    return buy_usd(price, p, j, cfg) < preempt_usd(victims, j, now, cfg)


def launching_spare(p: PoolView, pending_gpus: dict[int, tuple[int, int]]) -> list[int]:
    """Spare GPUs per node already launching in pool p, after the jobs they are for."""
    spare: list[int] = []
    for job_id, count in p.launching:
        g, n = pending_gpus.get(job_id, (0, 0))
        for i in range(count):
            spare.append(p.gpus_per_node - (g if i < n else 0))
    return spare

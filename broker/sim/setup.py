"""Building a replay: teams (weights, allowances), pools (partitions, cloud), jobs (class,
GPU types, spot policy, budget, who checkpoints on the signal), all from the scenario and
the trace, deterministically (see broker.sim.scenario)."""

from __future__ import annotations

import math
from collections.abc import Callable

from broker.policy import TeamView
from broker.policy.quota import team_quota
from broker.sim.policies import SimPolicy
from broker.sim.scenario import Scenario, pick_band, unit_hash
from broker.sim.state import SimJob, SimNode, SimPool
from broker.sim.trace import TraceJob
from broker.spec import Market, Priority, SpotPolicy


def team_views(sc: Scenario, trace: list[TraceJob]
               ) -> tuple[tuple[TeamView, ...], dict[str, float], Callable[[str], str]]:
    """(teams, normalized weights, queue -> team). A weight not given is the team's share of
    the trace's GPU-hours; an allowance not given is `priority_allowance_fraction` of its
    weighted share of the on-prem GPUs."""
    by_queue = {q: t.name for t in sc.teams for q in t.queues}

    def team_of(q: str) -> str:
        return by_queue.get(q, sc.default_team)

    gh: dict[str, float] = {t.name: 0.0 for t in sc.teams}
    for j in trace:
        gh[team_of(j.queue)] += j.duration_s * j.gpus
    total = sum(gh.values()) or 1.0
    raw = {t.name: t.weight if t.weight is not None else max(gh[t.name] / total, 1e-3)
           for t in sc.teams}
    wsum = sum(raw.values())
    weights = {k: v / wsum for k, v in raw.items()}
    out = []
    for t in sc.teams:
        allow = t.priority_allowance_gpus
        if allow is None:
            allow = math.ceil(weights[t.name] * sc.onprem_gpus * sc.priority_allowance_fraction)
        out.append(TeamView(t.name, weights[t.name], allow, 0.0, team_quota(t.quota)))
    return tuple(out), weights, team_of


def sim_pools(sc: Scenario, pol: SimPolicy, weights: dict[str, float]) -> dict[str, SimPool]:
    """On-prem pools (one per team partition for a partitioned policy), and the cloud pools
    when the policy rents."""
    pools: dict[str, SimPool] = {}
    for p in sc.onprem:
        parts = partition(weights, p.nodes) if pol.partitioned else {None: p.nodes}
        for team, n in parts.items():
            name = p.name if team is None else f"{p.name}/{team}"
            sp = SimPool(name, p.gpu_type, p.gpus_per_node, Market.ONPREM, False,
                         teams=None if team is None else frozenset({team}))
            for i in range(n):
                sp.add_node(SimNode(f"{name}-{i}", p.gpus_per_node))
            pools[name] = sp
    if pol.config.cloud:
        for c in sc.cloud:
            pools[c.name] = SimPool(
                c.name, c.gpu_type, c.gpus_per_node, c.market, True, c.price_per_node_hour,
                c.on_demand_price, c.max_nodes, c.launch_latency_s, c.interruption_rate_per_h,
                c.idle_timeout_s, stockouts_per_day=c.stockouts_per_day,
                stockout_mean_s=c.stockout_mean_s, seed=sc.seed)
    return pools


def partition(weights: dict[str, float], nodes: int) -> dict[str | None, int]:
    """Nodes per team by weight, largest remainder first (ties by name)."""
    exact = {t: w * nodes for t, w in weights.items()}
    got: dict[str | None, int] = {t: int(v) for t, v in exact.items()}
    for t in sorted(exact, key=lambda t: (-(exact[t] - got[t]), t))[: nodes - sum(got.values())]:
        got[t] += 1
    return got


def sim_job(sc: Scenario, jid: int, t: TraceJob, team_of: Callable[[str], str]) -> SimJob:
    """The trace job with what the trace lacks assigned by hash of its id (what a recorded
    trace knows, its team, class, GPU types, spot policy and signal behaviour, is kept)."""
    cls = Priority(t.priority) if t.priority else pick_band(
        unit_hash(sc.seed, "class", t.job_id),
        [(c, sc.classes.get(c, 0.0)) for c in
         (Priority.URGENT, Priority.HIGH, Priority.NORMAL, Priority.LOW)])
    if t.gpu_types is not None:
        types: tuple[str, ...] = t.gpu_types
    else:
        band = pick_band(unit_hash(sc.seed, "types", t.job_id), list(sc.gpu_types.items()))
        types = () if band == "any" else tuple(x.strip() for x in band.split(","))
    saves = (t.saves_on_signal if t.saves_on_signal is not None
             else unit_hash(sc.seed, "ckpt", t.job_id) < sc.checkpoint_on_signal)
    return SimJob(t, jid, t.team or team_of(t.queue), cls, types,
                  SpotPolicy(t.spot) if t.spot else sc.spot.get(cls, SpotPolicy.ALLOWED),
                  sc.budget_usd.get(cls), t.duration_s, t.submit_s, saves_on_signal=saves)

"""Replay a broker's own history under its config and under changed settings (issue 31).

`scenario_of(cfg, trace, prices)` turns an onepool.yaml (a ClusterConfig) into the
simulator's Scenario, so the replay runs the config's own policy knobs (`broker:` is the
same PolicySettings), pools and teams:
- on-prem pools: their nodes as configured; rented pools: `max_nodes`, launch latency, idle
  timeout and interruption rate as configured, at the price given in `prices` (the mean the
  broker recorded over the history's window) or else the pool's `price_per_node_hour`
  (a spot pool's on-demand reference is the same price: the replay compares settings, not
  markets);
- teams: their weights and high/urgent allowances; a job's team is the exported trace's
  `team` column (each team's queue is its own name);
- the plan cadence `cycle_s` is the broker's; `checkpoint_interval_s` as given (the jobs'
  most common one); `checkpoint_save_s` min(30 s, grace_s); on-prem GPU-hours are free
  (cost is the rented capacity's);
- runtime estimates are learned (per team and GPU count), as the broker learns them.

`compare(trace, current, changed)` replays both with the full `onepool` policy and returns
their outcomes (OUTCOME keys) and the difference, changed minus current, of every number.
With `recorded` (what the home measured, broker.state.history.recorded_outcome), it also
says how close the replay under the current config came to what really happened.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from broker.errors import SpecError
from broker.sim.compare import diff
from broker.sim.policies import resolve
from broker.sim.scenario import CloudPool, OnpremPool, Scenario, TeamRule
from broker.sim.simulator import Simulator
from broker.sim.trace import TraceJob
from broker.spec import ClusterConfig, PolicySettings, Priority

# what a replay reports and compares: waits by class and team, lost GPU-hours, cost,
# occupancy, preemptions (broker.sim.metrics defines each)
OUTCOME = ("jobs_completed", "wait_s_mean", "wait_s_by_team", "wait_s", "preemptions",
           "interruptions", "lost_gpu_hours_preemption", "lost_gpu_hours_interruption",
           "cloud_cost_usd", "cloud_gpu_hours", "onprem_occupancy")
SAVE_S = 30.0


def scenario_of(cfg: ClusterConfig, trace: list[TraceJob],
                prices: Mapping[str, float] | None = None, name: str = "history",
                checkpoint_interval_s: float = 1800.0) -> Scenario:
    """The Scenario that replays `trace` under `cfg` (see the module docstring). Raises
    SpecError when the config has no on-prem pool with nodes (the simulator needs one)."""
    prices = prices or {}
    onprem = [OnpremPool(name=p.name, gpu_type=p.gpu_type, gpus_per_node=p.gpus_per_node, nodes=p.nodes)
              for p in cfg.pools if not p.rented and p.nodes > 0]
    if not onprem:
        raise SpecError("replay", ["pools: the replay needs at least one on-prem pool with nodes "
                                   "(the simulator models rented pools beside on-prem capacity)"])
    cloud = []
    for p in cfg.pools:
        if not p.rented:
            continue
        price = prices.get(p.name) or p.price_per_node_hour
        if price <= 0:
            raise SpecError("replay", [f"pools.{p.name}: no recorded price and no price_per_node_hour"])
        cloud.append(CloudPool(name=p.name, provider=p.provider, gpu_type=p.gpu_type,
                               gpus_per_node=p.gpus_per_node, market=p.market,
                               price_per_node_hour=price, on_demand_price_per_node_hour=price,
                               max_nodes=p.max_nodes or 1, launch_latency_s=p.launch_latency_s,
                               interruption_rate_per_h=p.interruption_rate_per_h or 0.0,
                               idle_timeout_s=p.idle_timeout_s, source="recorded prices"))
    teams = [TeamRule(name=t.name, queues=[t.name], weight=t.weight,
                      priority_allowance_gpus=t.priority_allowance_gpus) for t in cfg.teams]
    seen = Counter(j.priority or Priority.NORMAL.value for j in trace)
    total = sum(seen.values())
    classes = {Priority(c): n / total for c, n in seen.items()} if total else {Priority.NORMAL: 1.0}
    policy = {k: getattr(cfg.broker, k) for k in PolicySettings.model_fields}
    return Scenario(name=name, description="a broker's own history", onprem=onprem, cloud=cloud,
                    teams=teams, default_team=cfg.teams[0].name, classes=classes,
                    cycle_s=cfg.broker.cycle_s, checkpoint_save_s=min(SAVE_S, cfg.broker.grace_s),
                    checkpoint_interval_s=checkpoint_interval_s, onprem_usd_per_gpu_hour=0.0,
                    **policy)


def replay(trace: list[TraceJob], sc: Scenario) -> dict[str, Any]:
    """The outcome (OUTCOME keys) of replaying `trace` under `sc` with the `onepool` policy."""
    (pol,) = resolve(["onepool"], sc, sc.policy)
    out = Simulator(trace, sc, pol).run()
    return {k: out[k] for k in OUTCOME}


def compare(trace: list[TraceJob], current: Scenario, changed: Scenario,
            recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Both replays, and `diff` = changed - current for every number they share (see the
    module docstring); with `recorded`, `fidelity` = replay under current - recorded."""
    a, b = replay(trace, current), replay(trace, changed)
    out: dict[str, Any] = {"jobs": len(trace), "current": a, "changed": b, "diff": diff(a, b)}
    if recorded is not None:
        out["recorded"] = dict(recorded)
        out["fidelity"] = diff(recorded, a)
    return out

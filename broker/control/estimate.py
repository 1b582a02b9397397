"""The estimate at submit (issue 29), on the live database: the snapshot the leader would plan
on now, with the job added as the newest pending one, handed to broker.policy.forecast.

Read-only: nothing is written. Differences from the leader's own snapshot, each erring the
same way for every job: a rented pool is seen from its config (its max_nodes, launch latency,
price and interruption rate: no node launching, no stock-out), and team budgets are not
applied (an exhausted team's job is estimated as if it could run).
"""

from __future__ import annotations

from dataclasses import replace

from sqlmodel import Session

from broker.client.estimate_info import EstimateInfo
from broker.control import holds
from broker.control.snapshots import build_snapshot, runtime_history
from broker.policy import PendingView, PolicyConfig, PoolView, Snapshot
from broker.policy.forecast import Forecast, forecast
from broker.spec import ClusterConfig, JobSpec, PoolSpec

NEW_JOB = -1  # the id the job being estimated has in the replay (real ids are positive)


def live_snapshot(s: Session, cfg: ClusterConfig, now: float) -> Snapshot:
    """What the policy would see now, without the held jobs (broker.control.holds)."""
    settings = cfg.broker
    snap = build_snapshot(s, now, PolicyConfig.from_settings(settings, "broker"),
                          settings.fair_share_half_life_s)
    specs = {p.name: p for p in cfg.pools}
    pools = tuple(_rented(p, specs[p.name]) if p.name in specs and specs[p.name].rented else p
                  for p in snap.pools)
    snap, _ = holds.hold(replace(snap, pools=pools), s)
    return snap


def _rented(view: PoolView, spec: PoolSpec) -> PoolView:
    return replace(view, max_nodes=spec.max_nodes, launch_latency_s=spec.launch_latency_s,
                   interruption_rate_per_h=spec.interruption_rate_per_h or 0.0,
                   idle_timeout_s=spec.idle_timeout_s)


def estimate_new(s: Session, cfg: ClusterConfig, js: JobSpec, now: float) -> Forecast:
    """The forecast of `js` (its first element, for an array) as if submitted now."""
    learned = runtime_history(s).estimate((js.team, js.experiment))
    snap = live_snapshot(s, cfg, now)
    job = PendingView(NEW_JOB, js.team, js.priority, js.gpus_per_node, now, js.nodes,
                      tuple(js.gpu_types), js.spot, budget_usd=js.budget_usd,
                      expected_duration_s=js.expected_duration_s or learned,
                      checkpoint_interval_s=js.interval_hint_s)
    return forecast(replace(snap, pending=(*snap.pending, job)), NEW_JOB)


def estimate_pending(s: Session, cfg: ClusterConfig, job_ids: list[int], now: float) -> dict[int, Forecast]:
    """The forecasts of pending jobs (those not pending, or held this cycle, are left out)."""
    snap = live_snapshot(s, cfg, now)
    pending = {p.job_id for p in snap.pending}
    return {j: forecast(snap, j) for j in job_ids if j in pending}


def info(f: Forecast, now: float, job_id: int | None) -> EstimateInfo:
    """The forecast as the SDK and the API answer it."""
    return EstimateInfo(job_id=job_id, pool=f.pool, gpu_type=f.gpu_type, market=f.market,
                        start_p10=f.start_p10, start_p50=f.start_p50, start_p90=f.start_p90,
                        wait_p50_s=None if f.start_p50 is None else max(0.0, f.start_p50 - now),
                        runtime_s=f.runtime_s, cost_usd=f.cost_usd, cost_with_risk_usd=f.cost_with_risk_usd)

"""When a job would start, where, and what it would cost (issue 29): the live queue replayed
forward through the same plan() the engine and the simulator run. Pure.

`forecast(snap, job_id)` replays `snap` (the job among its pending) event by event: each
step plans, starts what plan() places (a job placed runs for its estimate), lets a job that
plan() rents nodes for start in them after the pool's launch latency, stops preemption
victims at once, and moves time to the next expected end (or plan's own wake_at). The job's
start is the time plan() first places it, or rents for it.

What is not known is assumed, and said here:
- A running or started job without an estimate runs `unknown_runtime_s` more (an attempt
  past its estimate too: it has outrun it).
- A victim of a preemption leaves the replay (it would requeue; its return is not modelled).
- The band: the replay gives the p50; what it cannot see (jobs submitted later that go
  ahead, runtimes off their estimates, victims requeued) is the spread around it: p10 and p90
  are the p50's wait scaled by WAIT_BAND, the 10th and 90th percentiles of actual / predicted
  wait that bench/estimates.py measured on the shared trace (its first 8,000 jobs; the
  benchmark reports on later jobs).

Cost: the job's estimate (or `unknown_runtime_s`) times its GPUs at the pool's price; with
spot risk, plus the work each expected interruption loses (half a checkpoint interval and
`restart_s`), at the pool's interruption rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from broker.policy.plan import plan
from broker.policy.snapshot import PendingView, PoolView, RunningView, Snapshot

WAIT_BAND = {"p10": 0.2, "p90": 2.4}  # the p50's wait scaled, see the module doc
MAX_STEPS = 400  # plan() calls per replay at most


@dataclass(frozen=True, slots=True)
class Start:
    """One replay's answer: when (None: not within the horizon) and in which pool."""

    at: float | None
    pool: str | None


@dataclass(frozen=True, slots=True)
class Forecast:
    """What `forecast` answers. Times are absolute (the snapshot's clock); None: the replay did
    not start the job within its horizon. Costs in USD; None when no pool was found."""

    job_id: int
    pool: str | None
    gpu_type: str | None
    market: str | None
    start_p10: float | None
    start_p50: float | None
    start_p90: float | None
    runtime_s: float
    cost_usd: float | None
    cost_with_risk_usd: float | None


def _end(r: RunningView, now: float, scale: float, unknown_s: float) -> float:
    """When a running attempt ends in the replay: its expected end's remainder scaled, or
    `unknown_s` scaled when it has none left."""
    left = (r.expected_end - now) if r.expected_end is not None and r.expected_end > now else unknown_s
    return now + max(1.0, left * scale)


def replay(snap: Snapshot, job_id: int, scale: float = 1.0, unknown_runtime_s: float = 4 * 3600.0,
           horizon_s: float = 14 * 86400.0) -> Start:
    """When and where plan() first starts `job_id` (one of `snap.pending`), replaying forward."""
    now = snap.now
    running = [replace(r, expected_end=_end(r, now, scale, unknown_runtime_s)) for r in snap.running]
    pending = {p.job_id: p for p in snap.pending}
    # the nodes' cached use (used, releases, ready) describes `snap.running` only: plan()
    # derives it from the replay's running attempts instead
    pools = {p.name: replace(p, nodes=tuple(replace(n, used=None, releases=None, ready=None, ready_until=0.0)
                                            for n in p.nodes)) for p in snap.pools}
    snap = replace(snap, pools=tuple(pools.values()))
    fake_attempt = -1
    for _ in range(MAX_STEPS):
        s = replace(snap, now=now, running=tuple(running), pending=tuple(pending.values()),
                    queue=None, free_index=None, reclaim_index=None)
        p = plan(s, explain=False)
        gone = {pre.attempt_id for pre in p.preemptions}
        running = [r for r in running if r.attempt_id not in gone]
        for pl in p.placements:
            if pl.job_id == job_id:
                return Start(now, pl.pool)
            j = pending.pop(pl.job_id)
            dur = j.expected_duration_s or unknown_runtime_s
            running.append(RunningView(fake_attempt, j.job_id, j.team, pl.priority, pl.alloc, now,
                                       j.submit_time, expected_end=now + max(1.0, dur * scale)))
            fake_attempt -= 1
        for la in p.launches:
            if la.for_job_id == job_id:
                return Start(now + pools[la.pool].launch_latency_s, la.pool)
            pending.pop(la.for_job_id, None)  # runs on the nodes rented for it, apart from ours
        ends = [r.expected_end for r in running if r.expected_end is not None and r.expected_end > now]
        if p.wake_at is not None and p.wake_at > now:
            ends.append(p.wake_at)
        if not ends or min(ends) - snap.now > horizon_s:
            return Start(None, None)
        now = min(ends)
        running = [r for r in running if r.expected_end is None or r.expected_end > now]
    return Start(None, None)


def forecast(snap: Snapshot, job_id: int, unknown_runtime_s: float = 4 * 3600.0,
             restart_s: float = 60.0, band: Mapping[str, float] | None = None,
             cycle_s: float = 0.0) -> Forecast:
    """The job's pool, start band and cost (see the module doc). `job_id` must be pending in
    `snap`; raises KeyError otherwise. `band`: the wait ratios of p10 and p90 (default
    WAIT_BAND). `cycle_s`: how often the broker plans; a start the replay finds at t happens
    by the next cycle (p50: half a cycle later; p90: a whole one)."""
    job = next((p for p in snap.pending if p.job_id == job_id), None)
    if job is None:
        raise KeyError(f"job {job_id} is not pending in the snapshot")
    ratios = band or WAIT_BAND
    mid = replay(snap, job_id, 1.0, unknown_runtime_s)
    pool = next((p for p in snap.pools if p.name == mid.pool), None)
    runtime = job.expected_duration_s or unknown_runtime_s
    cost = risk = None
    if pool is not None:
        cost, risk = job_cost(job, pool, runtime, restart_s)
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    if mid.at is not None:
        wait = mid.at - snap.now
        p10, p50, p90 = (snap.now + wait * ratios["p10"], mid.at + cycle_s / 2.0,
                         snap.now + wait * ratios["p90"] + cycle_s)
    return Forecast(job_id, mid.pool, pool.gpu_type if pool else None,
                    pool.market.value if pool else None, p10, p50, p90, runtime, cost, risk)


def job_cost(job: PendingView, pool: PoolView, runtime_s: float, restart_s: float) -> tuple[float, float]:
    """(expected USD, USD with the spot interruption risk) of running `job` in `pool` for
    `runtime_s`: each expected interruption loses half a checkpoint interval and a restart."""
    per_s = job.gpus * pool.price_per_gpu_hour / 3600.0
    cost = runtime_s * per_s
    interruptions = pool.interruption_rate_per_h * job.nodes * runtime_s / 3600.0
    lost_s = interruptions * (min(job.checkpoint_interval_s, runtime_s) / 2.0 + restart_s)
    return cost, cost + (lost_s * per_s if math.isfinite(lost_s) else 0.0)

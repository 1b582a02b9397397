"""What a replay measures, per policy. Definitions (all GPU-hours are GPU x hours):

- jobs_completed; jobs_unplaceable (no pool the policy lets them use could ever hold them,
  e.g. a job bigger than its team's partition: they never start, and their wait counts as
  censored at the end, like a job still queued); jobs_unfinished (at the horizon: last
  submission + drain_limit_s).
- gpu_hours_delivered: the trace work of completed jobs (duration x GPUs).
- onprem_occupancy: allocated on-prem GPU time / on-prem GPU time, over the submission window.
- idle_while_waiting_gpu_hours: free on-prem GPUs that some waiting job could use, after
  each scheduling cycle, integrated until the next: the free GPUs of the nodes where a waiting
  job's shape fits (GPU type; a node with at least its GPUs per node free, in a pool with
  enough such nodes; partition walls are ignored: they are the waste this measures). GPUs a
  reservation holds count (idle is idle); fragments too small for any waiting job do not.
- wait_s: time spent queued, summed over a job's attempts (jobs still queued at the end, and
  unplaceable ones, count their wait until the end); jct_s: completion minus submission,
  completed jobs. Per class and `all`; wait_s_multinode: jobs with more than 8 GPUs.
  wait_s_mean: the mean wait per class and `all`; wait_s_by_team: mean, p50 and p95 per team.
- wait_s_within_quota: wait_s of the jobs of teams with a quota that were within it when
  submitted (their team's GPUs in use plus theirs at most its nominal; per GPU type, the sum).
- wait_s_within_allowance: wait_s of urgent and high jobs that anti-capture never scheduled
  as normal while they waited (their team was within its allowance).
- lost_gpu_hours_{preemption,interruption}: GPU time of ended attempts not kept as progress
  (drain, work since the last checkpoint, restart overhead), by cause.
- cloud_cost_usd: rented node-hours (launch to release) x price; cloud_cost_on_demand_usd:
  the same node-hours at the on-demand price of the same instance; cloud_by_pool: node-hours,
  cost and on-demand cost per rented pool (where the ratio of the two comes from);
  launches_refused: launches a pool in a stock-out refused.
- cost_per_gpu_hour: (cloud cost + on-prem GPUs x window hours x the amortized on-prem rate)
  / gpu_hours_delivered.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from broker.policy import PendingView
from broker.sim.scenario import Scenario
from broker.spec import Priority

CLASSES = [p.value for p in (Priority.URGENT, Priority.HIGH, Priority.NORMAL, Priority.LOW)]


class Recorder:
    def __init__(self, sc: Scenario, policy: str, window: tuple[float, float]) -> None:
        self.sc, self.policy = sc, policy
        self.w0, self.w1 = window
        self.completed = self.preemptions = self.interruptions = self.launch_refused = 0
        self.unplaced: list[Any] = []
        self.delivered_gpu_s = 0.0
        self.onprem_used = 0
        self.onprem_used_gpu_s = 0.0
        self.idle_fit = 0
        self.idle_fit_gpu_s = 0.0
        self.lost_gpu_s: dict[str, float] = {"preemption": 0.0, "interruption": 0.0}
        self.cloud_usd = self.cloud_od_usd = 0.0
        self.by_pool: dict[str, list[float]] = {}  # pool -> [node-hours, usd, on-demand usd]
        self.cloud_gpu_s = 0.0
        self.shapes: Counter[tuple[int, int, tuple[str, ...], str]] = Counter()
        self.hourly: list[float] = []  # on-prem GPU-seconds used per hour since the first submit

    # -- hooks called by the simulator ---------------------------------------------------------
    def integrate(self, t0: float, t1: float) -> None:
        a, b = max(t0, self.w0), min(t1, self.w1)
        if b > a:
            self.onprem_used_gpu_s += self.onprem_used * (b - a)
        self.idle_fit_gpu_s += self.idle_fit * (t1 - t0)
        if self.onprem_used:
            t = max(t0, self.w0)
            while t < t1:
                h = int((t - self.w0) // 3600)
                edge = min(t1, self.w0 + (h + 1) * 3600)
                if h >= len(self.hourly):
                    self.hourly.extend([0.0] * (h + 1 - len(self.hourly)))
                self.hourly[h] += self.onprem_used * (edge - t)
                t = edge

    def gpus_changed(self, pool: Any, delta: int) -> None:
        if not pool.rented:
            self.onprem_used += delta

    def queued(self, v: PendingView, sign: int) -> None:
        key = (v.gpus_per_node, v.nodes, v.gpu_types, v.team)
        self.shapes[key] += sign
        if not self.shapes[key]:
            del self.shapes[key]

    def after_cycle(self, pools: dict[str, Any]) -> None:
        idle = 0
        for p in pools.values():
            if p.rented or not p.free_total:
                continue
            g_min = min((g for g, n, types, _team in self.shapes
                         if (not types or p.gpu_type in types) and p.fits(g, n)), default=0)
            if g_min:
                idle += sum(f * p.hist[f] for f in range(g_min, len(p.hist)))
        self.idle_fit = idle

    def unplaceable(self, job: Any) -> None:
        self.unplaced.append(job)

    def lost(self, cause: str, gpu_s: float) -> None:
        self.lost_gpu_s[cause] = self.lost_gpu_s.get(cause, 0.0) + max(0.0, gpu_s)

    def finished(self, job: Any, gpu_s: float, pool: Any) -> None:
        self.completed += 1
        self.delivered_gpu_s += job.trace.duration_s * job.trace.gpus
        self.attempt_gpu_s(pool, gpu_s)

    def attempt_gpu_s(self, pool: Any, gpu_s: float) -> None:
        if pool.rented:
            self.cloud_gpu_s += gpu_s

    def bill(self, pool: str, node_hours: float, usd: float, od_usd: float) -> None:
        self.cloud_usd += usd
        self.cloud_od_usd += od_usd
        acc = self.by_pool.setdefault(pool, [0.0, 0.0, 0.0])
        acc[0] += node_hours
        acc[1] += usd
        acc[2] += od_usd

    # -- the result ----------------------------------------------------------------------------
    def result(self, jobs: list[Any], pending: dict[int, Any], running: dict[int, Any],
               detail: bool = False) -> dict[str, Any]:
        """The metrics (see the module docstring). With detail: `wait_cdf` (per class, the
        wait at every percentile 0..100) and `occupancy_hourly` (on-prem, per hour)."""
        end = max([self.w1] + [j.done_at for j in jobs if j.done_at is not None])
        waits: dict[str, list[float]] = {c: [] for c in CLASSES}
        jcts: dict[str, list[float]] = {c: [] for c in CLASSES}
        allowed: dict[str, list[float]] = {c: [] for c in CLASSES[:2]}
        quota: list[float] = []
        multi: list[float] = []
        by_team: dict[str, list[float]] = {}
        unplaced = {j.jid for j in self.unplaced}
        for j in jobs:
            if j.jid in pending:
                w = j.wait + (end - j.queued_at)
            elif j.jid in unplaced:
                w = end - j.trace.submit_s  # censored: it could never start
            elif j.first_start is None:
                continue  # beyond the horizon
            else:
                w = j.wait
            waits[j.cls.value].append(w)
            by_team.setdefault(j.team, []).append(w)
            if j.cls.value in allowed and not j.demoted:
                allowed[j.cls.value].append(w)
            if j.trace.gpus > 8:
                multi.append(w)
            if j.within_quota:
                quota.append(w)
            if j.done_at is not None:
                jcts[j.cls.value].append(j.done_at - j.trace.submit_s)
        waits["all"] = [x for c in CLASSES for x in waits[c]]
        jcts["all"] = [x for c in CLASSES for x in jcts[c]]
        allowed["all"] = [x for c in CLASSES[:2] for x in allowed[c]]
        delivered_h = self.delivered_gpu_s / 3600.0
        window_h = (self.w1 - self.w0) / 3600.0
        onprem = self.sc.onprem_gpus
        total_usd = self.cloud_usd + onprem * window_h * self.sc.onprem_usd_per_gpu_hour
        out = {
            "jobs_total": len(jobs),
            "jobs_completed": self.completed,
            "jobs_unplaceable": len(self.unplaced),
            "jobs_unfinished": len(pending) + len(running),
            "gpu_hours_delivered": round(delivered_h, 1),
            "onprem_occupancy": round(self.onprem_used_gpu_s / (onprem * 3600 * window_h), 4)
            if window_h else 0.0,
            "idle_while_waiting_gpu_hours": round(self.idle_fit_gpu_s / 3600.0, 1),
            "wait_s": {c: _pct(v, (50, 95, 99)) for c, v in waits.items()},
            "wait_s_mean": {c: round(float(np.mean(v)), 1) if v else None for c, v in waits.items()},
            "wait_s_by_team": {t: {"mean": round(float(np.mean(v)), 1), **_pct(v, (50, 95))}
                               for t, v in sorted(by_team.items())},
            "wait_s_within_allowance": {c: _pct(v, (50, 95, 99)) for c, v in allowed.items()},
            "jct_s": {c: _pct(v, (50, 95)) for c, v in jcts.items()},
            "wait_s_multinode": _pct(multi, (95, 99)),
            "wait_s_within_quota": {**_pct(quota, (50, 95, 99)), "jobs": len(quota)},
            "preemptions": self.preemptions,
            "interruptions": self.interruptions,
            "lost_gpu_hours_preemption": round(self.lost_gpu_s.get("preemption", 0.0) / 3600, 2),
            "lost_gpu_hours_interruption": round(self.lost_gpu_s.get("interruption", 0.0) / 3600, 2),
            "cloud_gpu_hours": round(self.cloud_gpu_s / 3600.0, 1),
            "cloud_cost_usd": round(self.cloud_usd, 2),
            "cloud_cost_on_demand_usd": round(self.cloud_od_usd, 2),
            "cloud_by_pool": {p: {"node_hours": round(h, 1), "cost_usd": round(u, 2),
                                  "on_demand_usd": round(o, 2)}
                              for p, (h, u, o) in sorted(self.by_pool.items())},
            "launches_refused": self.launch_refused,
            "cost_per_gpu_hour": round(total_usd / delivered_h, 4) if delivered_h else None,
        }
        if detail:
            qs = list(range(101))
            out["wait_cdf"] = {c: ([round(float(x), 1) for x in np.percentile(v, qs)] if v else [])
                               for c, v in waits.items()}
            out["occupancy_hourly"] = [round(x / (onprem * 3600), 4) for x in self.hourly]
        return out


def _pct(values: list[float], ps: tuple[int, ...]) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in ps}
    arr = np.asarray(values)
    return {f"p{p}": round(float(np.percentile(arr, p)), 1) for p in ps}

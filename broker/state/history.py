"""A broker's own history as a simulator trace, and what it measured (issue 31).

`export(s, since, until)` reads the jobs submitted in the window and their attempts:

- a job's work (the trace's `duration_s`): what its attempts kept, i.e. for each attempt
  that did not complete, its run time minus the work it lost (Attempt.lost_gpu_s / GPUs)
  minus its restart overhead, and for the attempt that ended the job, its run time minus
  its restart overhead (measured, else broker.restart_overhead_s, for every attempt after
  the first). A job still running counts what it ran so far, or its expected duration if
  longer; a job never started counts its expected duration, else the median work of
  finished jobs of its experiment, else of all jobs (at least 1 s);
- its team, class, acceptable GPU types, spot policy and shape (GPUs per node) as submitted;
  `saves_on_signal` is left to the scenario (the broker does not record it per job).

`prices(s, since, until)`: each pool's mean recorded price over the window (time-weighted
over broker.state.model.PriceChange), for the rented pools' replay.

`recorded_outcome(s, trace, cfg)`: what really happened, in the replay's terms
(broker.sim.metrics): mean waits by class and team (queued time summed over attempts; a
job still queued counts until `until`), preemptions, lost GPU-hours by cause, the ledger's
cost of rented pools, and on-prem occupancy over the submission window.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session, col, select

from broker.sim.trace import TraceJob
from broker.spec import ClusterConfig
from broker.state.model import Attempt, Job, JobState, LedgerEntry, PriceChange

CLASSES = ("urgent", "high", "normal", "low")


@dataclass(frozen=True)
class History:
    trace: list[TraceJob]
    checkpoint_interval_s: float
    since: float
    until: float


def export(s: Session, cfg: ClusterConfig, until: float, since: float | None = None) -> History:
    """The jobs submitted in [since, until) as a trace (see the module docstring), sorted by
    submission; times relative to the first submission."""
    q = select(Job).where(Job.submit_time < until).order_by(col(Job.submit_time), col(Job.id))
    if since is not None:
        q = q.where(Job.submit_time >= since)
    jobs = list(s.exec(q).all())
    by_job: dict[int, list[Attempt]] = defaultdict(list)
    if jobs:
        ids = [j.id for j in jobs]
        for a in s.exec(select(Attempt).where(col(Attempt.job_id).in_(ids)).order_by(col(Attempt.number))):
            by_job[a.job_id].append(a)
    overhead = cfg.broker.restart_overhead_s
    work: dict[int, float | None] = {}
    for j in jobs:
        work[j.id or 0] = _work(j, by_job[j.id or 0], until, overhead)
    done: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        w = work[j.id or 0]
        if w is not None and j.state == JobState.SUCCEEDED:
            done[j.experiment].append(w)
    every = [w for ws in done.values() for w in ws]
    fallback = statistics.median(every) if every else 3600.0
    t0 = jobs[0].submit_time if jobs else (since or until)
    out = []
    for j in jobs:
        w = work[j.id or 0]
        if w is None:
            w = j.expected_duration_s or (statistics.median(done[j.experiment]) if done[j.experiment]
                                          else fallback)
        out.append(TraceJob(job_id=str(j.id), submit_s=j.submit_time - t0, duration_s=max(1.0, w),
                            gpus=j.gpus_per_node * j.nodes, gpu_type="", user=j.submitted_by or "",
                            queue=j.team, team=j.team, priority=j.priority,
                            gpu_types=tuple(j.gpu_types), spot=j.spot, gpus_per_node=j.gpus_per_node))
    intervals = Counter(j.checkpoint_interval_s for j in jobs)
    interval = intervals.most_common(1)[0][0] if intervals else 1800.0
    return History(out, interval, t0, until)


def _work(j: Job, attempts: list[Attempt], until: float, overhead_s: float) -> float | None:
    """The work the job's attempts kept (see the module docstring); None: never started."""
    if not attempts:
        return None
    kept = 0.0
    for a in attempts:
        ran = max(0.0, (a.ended_at if a.ended_at is not None else until) - a.started_at)
        ovh = 0.0 if a.number <= 1 else (a.restart_overhead_s if a.restart_overhead_s is not None
                                          else overhead_s)
        lost = a.lost_gpu_s / a.gpus if a.gpus else 0.0
        kept += max(0.0, ran - lost - ovh)
    if j.state == JobState.RUNNING and j.expected_duration_s:
        kept = max(kept, j.expected_duration_s)
    return kept


def prices(s: Session, since: float, until: float) -> dict[str, float]:
    """Each pool's time-weighted mean USD per node-hour over [since, until) (the price in
    force at `since` counts from there); pools with no recorded price are absent."""
    rows = s.exec(select(PriceChange).where(PriceChange.at < until)
                  .order_by(col(PriceChange.pool), col(PriceChange.at))).all()
    by_pool: dict[str, list[PriceChange]] = defaultdict(list)
    for r in rows:
        by_pool[r.pool].append(r)
    out = {}
    for pool, changes in by_pool.items():
        total = weight = 0.0
        for i, c in enumerate(changes):
            start = max(c.at, since)
            end = changes[i + 1].at if i + 1 < len(changes) else until
            if end > start:
                total += c.usd_per_node_hour * (end - start)
                weight += end - start
        out[pool] = total / weight if weight else changes[-1].usd_per_node_hour
    return out


def recorded_outcome(s: Session, hist: History, cfg: ClusterConfig) -> dict[str, Any]:
    """What the home measured over the history (see the module docstring)."""
    ids = [int(t.job_id) for t in hist.trace]
    jobs = s.exec(select(Job).where(col(Job.id).in_(ids))).all() if ids else []
    attempts = s.exec(select(Attempt).where(col(Attempt.job_id).in_(ids))).all() if ids else []
    waits: dict[str, list[float]] = {c: [] for c in CLASSES}
    by_team: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        w = j.wait_s + (hist.until - j.queued_at if j.state == JobState.PENDING else 0.0)
        waits[j.priority].append(w)
        by_team[j.team].append(w)
    waits["all"] = [w for c in CLASSES for w in waits[c]]
    lost = {"preemption": 0.0, "interruption": 0.0}
    for a in attempts:
        kind = "interruption" if a.end_reason in ("INTERRUPTED", "LOST") else "preemption"
        lost[kind] += a.lost_gpu_s
    rented = {p.name for p in cfg.pools if p.rented}
    onprem_gpus = sum(p.gpus_per_node * p.nodes for p in cfg.pools if not p.rented)
    cost = 0.0
    if rented:
        cost = sum(e.usd for e in s.exec(select(LedgerEntry).where(
            col(LedgerEntry.pool).in_(rented), LedgerEntry.start >= hist.since,
            LedgerEntry.start < hist.until)))
    w0 = hist.since
    w1 = hist.since + (hist.trace[-1].submit_s if hist.trace else 0.0)
    used = 0.0
    for a in attempts:
        if a.pool in rented:
            continue
        a0, a1 = max(a.started_at, w0), min(a.ended_at if a.ended_at is not None else hist.until, w1)
        used += max(0.0, a1 - a0) * a.gpus
    span = (w1 - w0) * onprem_gpus
    return {
        "jobs_completed": sum(1 for j in jobs if j.state == JobState.SUCCEEDED),
        "wait_s_mean": {c: round(statistics.fmean(v), 1) if v else None for c, v in waits.items()},
        "wait_s_by_team": {t: {"mean": round(statistics.fmean(v), 1)} for t, v in sorted(by_team.items())},
        "preemptions": sum(1 for a in attempts if a.end_reason == "PREEMPTED"),
        "lost_gpu_hours_preemption": round(lost["preemption"] / 3600, 2),
        "lost_gpu_hours_interruption": round(lost["interruption"] / 3600, 2),
        "cloud_cost_usd": round(cost, 2),
        "onprem_occupancy": round(used / span, 4) if span > 0 else 0.0,
    }


def replay_history(s: Session, cfg: ClusterConfig, changed: ClusterConfig, now: float,
                   since: float | None = None) -> dict[str, Any]:
    """Export the history up to `now` (from `since`), replay it under `cfg` and `changed`,
    and compare both with what was recorded (broker.sim.replay.compare). Raises SpecError
    when there is nothing to replay or the config cannot be simulated."""
    from broker.errors import SpecError
    from broker.sim.replay import compare, scenario_of

    hist = export(s, cfg, now, since)
    if not hist.trace:
        raise SpecError("replay", ["since: no job was submitted in the window; nothing to replay"])
    pr = prices(s, hist.since, now)
    current = scenario_of(cfg, hist.trace, pr, "current", hist.checkpoint_interval_s)
    other = scenario_of(changed, hist.trace, pr, "changed", hist.checkpoint_interval_s)
    out = compare(hist.trace, current, other, recorded_outcome(s, hist, cfg))
    out["window"] = {"since": hist.since, "until": now}
    return out

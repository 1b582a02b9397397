"""Read-only query functions behind the dashboard (it reads nothing else). Plain dicts/rows,
so a page can hand them to a table or a chart as they are. Times are broker-clock seconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlmodel import Session, col, select

from broker.checkpoint.telemetry import cause_kind
from broker.control.budgets import TeamBudget, projected_end, team_budgets, window_bounds
from broker.control.config_apply import applied_config
from broker.state.costs import attempt_costs, lost_attempts
from broker.state.ledger import price_in_force, spend_by_job, usd_per_gpu_hour
from broker.state.model import Attempt, Job, LedgerEntry, NodeMeter, Pool, PriceChange


def _times(since: float, until: float, points: int) -> list[float]:
    step = max(1e-9, (until - since) / max(1, points - 1))
    return [since + i * step for i in range(points)]


def time_range(s: Session, now: float) -> tuple[float, float]:
    """From the first job's submission (or `now` - 1 h) to `now`."""
    first = s.exec(select(Job.submit_time).order_by(Job.submit_time)).first()
    return (min(first, now - 60.0) if first is not None else now - 3600.0), now


def gpus_in_use(s: Session, since: float, until: float, points: int = 60) -> list[dict[str, Any]]:
    """GPUs held by attempts at evenly spaced times: rows {t, pool, priority, gpus}."""
    rows = s.exec(select(Attempt).where(Attempt.started_at <= until, or_ended_after(since))).all()
    out = []
    for t in _times(since, until, points):
        acc: dict[tuple[str, str], int] = defaultdict(int)
        for a in rows:
            if a.started_at <= t and (a.ended_at is None or a.ended_at > t):
                acc[(a.pool, a.priority)] += a.gpus
        out += [{"t": t, "pool": p, "priority": c, "gpus": g} for (p, c), g in sorted(acc.items())]
    return out


def or_ended_after(t: float) -> Any:
    from sqlmodel import or_

    return or_(col(Attempt.ended_at).is_(None), col(Attempt.ended_at) > t)


def queue_length(s: Session, since: float, until: float, points: int = 60) -> list[dict[str, Any]]:
    """Jobs waiting at evenly spaced times, by priority class: rows {t, priority, pending}.
    A job waits from submission to its first start, and from each requeue to the next start."""
    jobs = {j.id: j for j in s.exec(select(Job).where(Job.submit_time <= until)).all()}
    atts: dict[int, list[Attempt]] = defaultdict(list)
    for a in s.exec(select(Attempt).order_by(Attempt.job_id, Attempt.number)).all():
        atts[a.job_id].append(a)
    spans: list[tuple[str, float, float]] = []
    for jid, j in jobs.items():
        start = j.submit_time
        for a in atts.get(jid or 0, []):
            spans.append((j.priority, start, a.started_at))
            start = a.ended_at if a.end_reason in ("PREEMPTED", "LOST", "INTERRUPTED") else None
            if start is None:
                break
        else:
            if j.state == "PENDING":
                spans.append((j.priority, start, until))
    out = []
    for t in _times(since, until, points):
        acc: dict[str, int] = defaultdict(int)
        for c, a0, a1 in spans:
            if a0 <= t < a1:
                acc[c] += 1
        out += [{"t": t, "priority": c, "pending": n} for c, n in sorted(acc.items())]
    return out


def experiment_jobs(s: Session, experiment: str) -> list[dict[str, Any]]:
    """The jobs of one experiment with what each cost."""
    jobs = s.exec(select(Job).where(Job.experiment == experiment).order_by(Job.id)).all()
    spend = spend_by_job(s, [j.id for j in jobs if j.id])
    return [{"job": j.id, "name": j.name, "team": j.team, "status": j.state, "priority": j.priority,
             "gpus": j.gpus, "attempts": j.attempts, "budget_usd": j.budget_usd,
             "usd": spend.get(j.id or 0, 0.0)} for j in jobs]


def job_attempts(s: Session, job_id: int) -> list[dict[str, Any]]:
    """One job's attempts with what each cost and lost."""
    usd = attempt_costs(s, job_id)
    return [{"attempt": a.number, "pool": a.pool, "gpus": a.gpus, "started_at": a.started_at,
             "ended_at": a.ended_at, "end": a.end_reason or a.state, "cause": a.cause,
             "lost_gpu_hours": a.lost_gpu_s / 3600.0, "usd": usd.get(a.id or 0, 0.0)}
            for a in s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number))]


def budget_overview(s: Session, now: float, window_s: float = 3600.0) -> list[dict[str, Any]]:
    """Per team: budget, spent, state, burn rate (USD/h over the last `window_s`) and the
    projected date the budget runs out at that rate."""
    out = []
    for b in team_budgets(s, applied_config(s), now):
        recent = sum(r.usd * _share(r.start, r.end, now - window_s, now) for r in s.exec(
            select(LedgerEntry).where(LedgerEntry.team == b.team, LedgerEntry.end >= now - window_s)))
        burn = recent * 3600.0 / window_s
        out.append({"team": b.team, "window": b.window, "budget_usd": b.amount, "spent_usd": b.spent,
                    "left_usd": b.remaining, "state": b.state, "burn_usd_per_h": burn,
                    "projected_end": projected_end(b, burn, now)})
    return out


def _share(start: float, end: float, lo: float, hi: float) -> float:
    if end <= start:
        return 1.0 if lo <= start < hi else 0.0
    return max(0.0, min(end, hi) - max(start, lo)) / (end - start)


def burndown(s: Session, team: str, now: float, points: int = 40) -> list[dict[str, Any]]:
    """A team's budget left over its current window, at evenly spaced times up to `now`:
    rows {t, left_usd}. Empty when the team has no budget."""
    b: TeamBudget | None = next((x for x in team_budgets(s, applied_config(s), now) if x.team == team),
                                None)
    if b is None or b.amount is None:
        return []
    start, _ = window_bounds(b.window, now)
    first = s.exec(select(LedgerEntry.start).where(LedgerEntry.team == team, LedgerEntry.start >= start)
                   .order_by(LedgerEntry.start)).first()
    lo = first if first is not None else start
    rows = s.exec(select(LedgerEntry).where(LedgerEntry.team == team, LedgerEntry.start >= start)).all()
    return [{"t": t, "left_usd": b.amount - sum(r.usd * _share(r.start, r.end, r.start, t) for r in rows)}
            for t in _times(lo, now, points)]


def lost_timeline(s: Session) -> list[dict[str, Any]]:
    """Every attempt that lost work: when, whose job, why, who caused it, GPU-hours and USD."""
    out = []
    for a, j, rate in lost_attempts(s):
        by_team = None
        if a.preempted_by is not None:
            by = s.get(Job, a.preempted_by)
            by_team = by.team if by else None
        out.append({"t": a.ended_at, "job": j.id, "team": j.team, "cause": cause_kind(a.cause),
                    "caused_by_job": a.preempted_by, "caused_by_team": by_team,
                    "lost_gpu_hours": a.lost_gpu_s / 3600.0, "lost_usd": a.lost_gpu_s * rate})
    return sorted(out, key=lambda r: r["t"] or 0.0)


def pool_prices(s: Session, now: float) -> list[dict[str, Any]]:
    """Every pool's offer now: market, GPU type, node price in force, charged USD per GPU-hour
    (on-prem: amortized, free for placement), nodes on the meter, price changes recorded."""
    cfg = applied_config(s)
    out = []
    for p in s.exec(select(Pool).order_by(Pool.name)).all():
        node_h = price_in_force(s, p, now)
        changes = len(s.exec(select(PriceChange.id).where(PriceChange.pool == p.name)).all())
        up = len(s.exec(select(NodeMeter.id).where(NodeMeter.pool == p.name,
                                                   col(NodeMeter.ended_at).is_(None))).all())
        out.append({"pool": p.name, "provider": p.provider, "market": p.market, "gpu_type": p.gpu_type,
                    "gpus_per_node": p.gpus_per_node, "usd_per_node_hour": node_h,
                    "usd_per_gpu_hour": usd_per_gpu_hour(p, node_h, cfg),
                    "placement_usd_per_gpu_hour": 0.0 if p.market == "onprem" else node_h / p.gpus_per_node,
                    "nodes_metered": up, "price_changes": changes, "active": p.active})
    return out

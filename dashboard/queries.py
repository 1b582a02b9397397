"""Read-only query functions behind the dashboard (it reads nothing else). Plain dicts/rows,
so a page can hand them to a table or a chart as they are. Times are broker-clock seconds.

Every function takes `team`: None shows every team (an admin, the embedded single user); a team
name shows that team's jobs, attempts and money only (a member: broker.client.sdk's rule that a
member sees its own team's jobs). Capacity (pools, free GPUs) is not a team's secret.

Time series are step functions: one row per series at every moment any series changes, zeros
included, and a last row at `until` (now), so a chart drawn with step interpolation is flat
between changes, drops to zero when nothing runs, and reaches the present.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, or_, select

from broker.checkpoint.telemetry import cause_kind
from broker.control.budgets import TeamBudget, projected_end, team_budgets, window_bounds
from broker.control.config_apply import applied_config
from broker.phases import describe
from broker.state.costs import attempt_costs, attempt_rates, costs, spent_last, total_usd
from broker.state.ledger import spend_by_job
from broker.state.model import Attempt, AttemptState, EndReason, Event, Job, JobState, LedgerEntry

INTERRUPTED = (EndReason.PREEMPTED, EndReason.INTERRUPTED, EndReason.LOST)


def _of_team(team: str | None) -> Any:
    """The ids of `team`'s jobs, as a subquery (for `col(...).in_`)."""
    return select(Job.id).where(Job.team == team)


def time_range(s: Session, now: float, window_s: float = 86400.0,
               team: str | None = None) -> tuple[float, float]:
    """The charts' span: from the first job's submission, at most `window_s` back and at least a
    minute (an hour when there are no jobs), to `now`."""
    q = select(Job.submit_time).order_by(Job.submit_time)
    first = s.exec(q if team is None else q.where(Job.team == team)).first()
    if first is None:
        return now - 3600.0, now
    return min(max(first, now - window_s), now - 60.0), now


def steps(changes: Iterable[tuple[float, str, int]], since: float, until: float,
          value: str) -> list[dict[str, Any]]:
    """A step function per series from (time, series, delta) changes: rows {t, series, value}
    at `since`, at every change inside (since, until) and at `until`, for every series."""
    changes = sorted(changes)
    level: dict[str, int] = defaultdict(int)
    names = sorted({k for _, k, _ in changes})
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(changes) and changes[i][0] <= since:
        level[changes[i][1]] += changes[i][2]
        i += 1
    out += [{"t": since, "series": k, value: level[k]} for k in names]
    while i < len(changes) and changes[i][0] < until:
        t = changes[i][0]
        while i < len(changes) and changes[i][0] == t:
            level[changes[i][1]] += changes[i][2]
            i += 1
        out += [{"t": t, "series": k, value: level[k]} for k in names]
    out += [{"t": until, "series": k, value: level[k]} for k in names]
    return out


def gpus_in_use(s: Session, since: float, until: float, team: str | None = None) -> list[dict[str, Any]]:
    """GPUs held by attempts, per "pool / class", as a step function (see `steps`)."""
    q = select(Attempt).where(Attempt.started_at <= until,
                              or_(col(Attempt.ended_at).is_(None), col(Attempt.ended_at) > since))
    rows = s.exec(q if team is None else q.where(col(Attempt.job_id).in_(_of_team(team))))
    changes: list[tuple[float, str, int]] = []
    for a in rows:
        key = f"{a.pool} / {a.priority}"
        changes.append((a.started_at, key, a.gpus))
        if a.ended_at is not None:
            changes.append((a.ended_at, key, -a.gpus))
    return steps(changes, since, until, "gpus")


def queue_length(s: Session, since: float, until: float, team: str | None = None) -> list[dict[str, Any]]:
    """Jobs waiting, per priority class, as a step function (see `steps`). A job waits from
    its submission to its first start, and from each requeue to its next start; a pending
    job cancelled waited until then."""
    q = select(Job).where(Job.submit_time <= until)
    jobs = {j.id: j for j in s.exec(q if team is None else q.where(Job.team == team)).all()}
    atts: dict[int, list[Attempt]] = defaultdict(list)
    for a in s.exec(select(Attempt).order_by(Attempt.job_id, Attempt.number)).all():
        atts[a.job_id].append(a)
    changes: list[tuple[float, str, int]] = []
    for jid, j in jobs.items():
        start: float | None = j.submit_time
        for a in atts.get(jid or 0, []):
            if start is not None:
                changes += [(start, j.priority, 1), (a.started_at, j.priority, -1)]
            start = a.ended_at if a.end_reason in INTERRUPTED and a.ended_at is not None else None
        if start is not None and j.state != JobState.RUNNING:
            changes.append((start, j.priority, 1))
            if j.state != JobState.PENDING and j.end_time is not None:  # cancelled while waiting
                changes.append((max(start, j.end_time), j.priority, -1))
    return steps(changes, since, until, "waiting")


def now_overview(s: Session, now: float, team: str | None = None) -> dict[str, Any]:
    """The numbers of this moment: GPUs held now, jobs running and waiting now, the money (a
    team's: what broker.state.costs charges to it)."""
    live_q = select(Attempt).where(Attempt.state != AttemptState.ENDED)
    states_q = select(Job.state)
    if team is not None:
        live_q = live_q.where(col(Attempt.job_id).in_(_of_team(team)))
        states_q = states_q.where(Job.team == team)
    live, states = s.exec(live_q).all(), list(s.exec(states_q).all())
    last = s.exec(select(LedgerEntry.end).order_by(col(LedgerEntry.end).desc())).first()
    if team is None:
        total, last_hour = total_usd(s), spent_last(s, now, 3600.0)
    else:
        def of_team(since: float | None, until: float | None) -> float:
            return sum(r.usd for r in costs(s, "team", since, until) if r.key == team)
        total, last_hour = of_team(None, None), of_team(now - 3600.0, now)
    return {"gpus_in_use": sum(a.gpus for a in live),
            "jobs_running": sum(1 for x in states if x == JobState.RUNNING),
            "jobs_waiting": sum(1 for x in states if x == JobState.PENDING),
            "total_usd": total, "spent_last_hour_usd": last_hour, "metered_until": last}


def experiment_jobs(s: Session, experiment: str, team: str | None = None) -> list[dict[str, Any]]:
    """The jobs of one experiment with what each cost."""
    q = select(Job).where(Job.experiment == experiment).order_by(Job.id)
    jobs = s.exec(q if team is None else q.where(Job.team == team)).all()
    spend = spend_by_job(s, [j.id for j in jobs if j.id])
    return [{"job": j.id, "name": j.name, "team": j.team, "status": j.state, "priority": j.priority,
             "gpus": j.gpus, "attempts": j.attempts, "budget_usd": j.budget_usd,
             "usd": spend.get(j.id or 0, 0.0)} for j in jobs]


def job_attempts(s: Session, job_id: int) -> list[dict[str, Any]]:
    """One job's attempts: where each ran, when, why it ended, its steps, its GPU utilization
    (newest and mean, percent; None where no agent sampled it), what it cost and lost, and its
    restart phases (broker.phases: fetch code, pull image, setup, fetch data, first progress)."""
    usd = attempt_costs(s, job_id)
    out = []
    for a in s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)):
        out.append({"attempt": a.number, "pool": a.pool,
                    "nodes": " ".join(f"{n}[{','.join(map(str, sl))}]" for n, sl in a.alloc),
                    "gpus": a.gpus, "started_at": a.started_at, "ended_at": a.ended_at,
                    "end": a.end_reason or a.state, "why": a.cause or ("completed" if a.end_reason ==
                                                                      EndReason.COMPLETED else ""),
                    "from_step": a.restored_step, "to_step": a.reached_step,
                    "reported_step": a.progress_step, "lost_gpu_hours": a.lost_gpu_s / 3600.0,
                    "gpu_util_pct": a.gpu_util_pct, "gpu_util_mean_pct": a.gpu_util_mean_pct,
                    "usd": usd.get(a.id or 0, 0.0),
                    "restart": describe(a.phases or {}, a.restart_overhead_s), "id": a.id})
    return out


def job_events(s: Session, job_id: int, limit: int = 200) -> list[dict[str, Any]]:
    """The job's newest events, oldest first."""
    rows = s.exec(select(Event).where(Event.job_id == job_id).order_by(col(Event.id).desc()).limit(limit))
    return [{"t": e.time, "kind": e.kind, "message": e.message} for e in reversed(rows.all())]


def log_tail(home: Path, attempt_id: int, rank: int = 0, max_bytes: int = 8192) -> str | None:
    """The end of an attempt's output (the embedded executor's run folder), None if it has none.
    (When the API exists this is its logs endpoint.)"""
    path = home / "runs" / f"attempt-{attempt_id}" / f"rank-{rank}" / "output.log"
    if not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - max_bytes))
        text = f.read().decode(errors="replace")
    return text if path.stat().st_size <= max_bytes else text.split("\n", 1)[-1]


def interruptions(s: Session, limit: int = 500, team: str | None = None) -> list[dict[str, Any]]:
    """The newest `limit` attempts that did not end on their own terms (preempted, interrupted
    by the cloud, their node lost), newest first: when, whose job, why, who caused it, the work
    lost (zero included: a job that checkpointed on the signal lost nothing) and its value.
    With a `team`: its jobs' interruptions, naming the team that caused each but the causing
    job's id only when it is the team's own."""
    q = (select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
         .where(col(Attempt.end_reason).in_(list(INTERRUPTED))))
    if team is not None:
        q = q.where(Job.team == team)
    rows = s.exec(q.order_by(col(Attempt.ended_at).desc()).limit(limit)).all()
    rates = attempt_rates(s, [a.id for a, _ in rows if a.id is not None])
    by_ids = {a.preempted_by for a, _ in rows if a.preempted_by is not None}
    teams = {j.id: j.team for j in s.exec(select(Job).where(col(Job.id).in_(list(by_ids))))} if by_ids else {}
    out = [{"t": a.ended_at, "job": j.id, "name": j.name, "team": j.team, "attempt": a.number,
            "pool": a.pool, "cause": cause_kind(a.cause),
            "caused_by_job": a.preempted_by if team is None or teams.get(a.preempted_by or -1) == team
            else None,
            "caused_by_team": teams.get(a.preempted_by or -1), "lost_gpu_hours": a.lost_gpu_s / 3600.0,
            "lost_usd": a.lost_gpu_s * rates.get(a.id or 0, 0.0), "reached_step": a.reached_step}
           for a, j in rows]
    return sorted(out, key=lambda r: -(r["t"] or 0.0))


def budget_overview(s: Session, now: float, window_s: float = 3600.0,
                    team: str | None = None) -> list[dict[str, Any]]:
    """Per team (or `team` only): budget, spent, state, burn rate (USD/h over the last
    `window_s`) and the projected date the budget runs out at that rate."""
    out = []
    for b in team_budgets(s, applied_config(s), now):
        if team is not None and b.team != team:
            continue
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


def budget_changes(s: Session, team: str, configured: float | None) -> list[tuple[float, float | None]]:
    """A team's budget over time: (from when, USD), oldest first. The configured amount holds
    from the beginning (-inf) until the first override (`onepool budget set --team`, recorded
    as a team_budget_set event), each override from the moment it was set."""
    evs = s.exec(select(Event).where(Event.kind == "team_budget_set").order_by(col(Event.time))).all()
    return [(-math.inf, configured)] + [(e.time, float(e.data["usd"])) for e in evs
                                        if (e.data or {}).get("team") == team and "usd" in e.data]


def budget_at(changes: list[tuple[float, float | None]], t: float) -> float | None:
    """The budget in force at `t` (see budget_changes)."""
    return next(usd for since, usd in reversed(changes) if since <= t)


def burndown(s: Session, team: str, now: float, points: int = 40) -> list[dict[str, Any]]:
    """A team's budget and what is left of it over its current window, at evenly spaced times
    up to `now` and at each override's moment: rows {t, budget_usd, left_usd}. An override
    counts only from the time it was set (before it, the budget then in force). Empty when the
    team has no budget now."""
    cfg = applied_config(s)
    b: TeamBudget | None = next((x for x in team_budgets(s, cfg, now) if x.team == team), None)
    if b is None or b.amount is None:
        return []
    changes = budget_changes(s, team, next(t.budget_usd for t in cfg.teams if t.name == team))
    start, _ = window_bounds(b.window, now)
    first = s.exec(select(LedgerEntry.start).where(LedgerEntry.team == team, LedgerEntry.start >= start)
                   .order_by(LedgerEntry.start)).first()
    lo = first if first is not None else start
    rows = s.exec(select(LedgerEntry).where(LedgerEntry.team == team, LedgerEntry.start >= start)).all()
    step = max(1e-9, (now - lo) / max(1, points - 1))
    times = sorted({*(lo + i * step for i in range(points)), *(t for t, _ in changes if lo < t <= now)})
    out = []
    for t in times:
        amount = budget_at(changes, t)
        spent = sum(r.usd * _share(r.start, r.end, r.start, t) for r in rows)
        out.append({"t": t, "budget_usd": amount, "left_usd": None if amount is None else amount - spent})
    return out


MOVE_EVENTS = ("rebalance_move", "rebalance_moved", "rebalance_realized", "rebalance_abandoned")


def rebalance_moves(s: Session, limit: int = 500, team: str | None = None) -> list[dict[str, Any]]:
    """Every rebalancing move (broker.control.rebalancer), newest first: when it was decided,
    the job, from and to which pool, why, its expected saving and cost (USD over the job's
    expected remaining run time), where it stands (checkpointing/stopping, moved, done,
    abandoned) and, once its attempt in the new pool ended, the realized saving."""
    q = select(Event).where(col(Event.kind).in_(MOVE_EVENTS))
    if team is not None:
        q = q.where(col(Event.job_id).in_(_of_team(team)))
    evs = s.exec(q.order_by(col(Event.time), col(Event.id))).all()
    rows: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}
    for e in evs:
        d = e.data or {}
        if e.kind == "rebalance_move":
            row = {"t": e.time, "job": e.job_id, "from_pool": d.get("from_pool"),
                   "to_pool": d.get("to_pool"), "reason": d.get("reason"),
                   "expected_saving_usd": d.get("saving_usd"), "cost_usd": d.get("cost_usd"),
                   "state": "in progress", "realized_saving_usd": None}
            rows.append(row)
            open_[e.job_id or 0] = row
            continue
        row = open_.get(e.job_id or 0)
        if row is None:
            continue
        if e.kind == "rebalance_moved":
            row["state"] = "moved"
        elif e.kind == "rebalance_realized":
            row["state"], row["realized_saving_usd"] = "done", d.get("realized_saving_usd")
            del open_[e.job_id or 0]
        else:
            row["state"] = f"abandoned: {d.get('why', '')}"
            del open_[e.job_id or 0]
    return sorted(rows, key=lambda r: -r["t"])[:limit]

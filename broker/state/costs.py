"""Cost queries over the ledger (broker/state/ledger.py): the one place the CLI, the SDK and the
dashboard read money from.

`costs(s, by=..., since=, until=)` groups charged USD by experiment, team, pool or job:

- rows spanning [start, end] are pro-rated to the part inside [since, until);
- `gpu_hours` counts GPU-hours jobs held (idle GPUs are money, not work);
- `lost_gpu_hours` / `lost_usd`: work lost by attempts that ended in the window, valued at
  what those very GPUs were charged (the attempt's USD per GPU-second);
- by="team" includes idle rented time charged to a launching team; by="pool" includes all
  idle time; by="experiment" / "job" count only what jobs were charged.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from pydantic import BaseModel
from sqlmodel import Session, col, select

from broker.state.model import Attempt, Job, LedgerEntry

CostBy = Literal["experiment", "team", "pool", "job"]
COST_BY: tuple[str, ...] = ("experiment", "team", "pool", "job")


class CostRow(BaseModel):
    """Money under one key. `jobs` counts distinct jobs charged or losing work there."""

    key: str
    usd: float
    gpu_hours: float
    lost_gpu_hours: float
    jobs: int
    lost_usd: float = 0.0
    idle_usd: float = 0.0


def _check_by(by: str) -> None:
    if by not in COST_BY:
        raise ValueError(f"by must be one of {', '.join(COST_BY)} (got {by!r})")


def _key(by: str, pool: str, team: str | None, experiment: str | None,
         job_id: int | None) -> str | None:
    if by == "pool":
        return pool
    if by == "team":
        return team
    if job_id is None:
        return None
    return experiment if by == "experiment" else str(job_id)


def _overlap(start: float, end: float, since: float | None, until: float | None) -> float:
    """The fraction of [start, end] inside [since, until) (an instant: 1 or 0)."""
    lo = start if since is None else max(start, since)
    hi = end if until is None else min(end, until)
    if end <= start:
        return 1.0 if (since is None or start >= since) and (until is None or start < until) else 0.0
    return max(0.0, hi - lo) / (end - start)


def costs(s: Session, by: CostBy = "experiment", since: float | None = None,
          until: float | None = None) -> list[CostRow]:
    """USD, GPU-hours and lost work per key, most expensive first. Raises ValueError for a
    `by` other than experiment, team, pool, job."""
    _check_by(by)
    q = select(LedgerEntry)
    if until is not None:
        q = q.where(LedgerEntry.start < until)
    if since is not None:
        q = q.where(LedgerEntry.end >= since)
    usd: dict[str, float] = defaultdict(float)
    idle: dict[str, float] = defaultdict(float)
    gpu_h: dict[str, float] = defaultdict(float)
    jobs: dict[str, set[int]] = defaultdict(set)
    for r in s.exec(q).all():
        key = _key(by, r.pool, r.team, r.experiment, r.job_id)
        if key is None:
            continue
        f = _overlap(r.start, r.end, since, until)
        if f <= 0:
            continue
        usd[key] += r.usd * f
        if r.kind == "idle":
            idle[key] += r.usd * f
        if r.kind == "gpu":
            gpu_h[key] += r.gpus * (r.end - r.start) * f / 3600.0
        if r.job_id is not None:
            jobs[key].add(r.job_id)
    lost_h: dict[str, float] = defaultdict(float)
    lost_usd: dict[str, float] = defaultdict(float)
    for a, j, rate in lost_attempts(s, since, until):
        key = _key(by, a.pool, j.team, j.experiment, j.id)
        if key is None:
            continue
        lost_h[key] += a.lost_gpu_s / 3600.0
        lost_usd[key] += a.lost_gpu_s * rate
        jobs[key].add(j.id or 0)
        usd.setdefault(key, 0.0)
    rows = [CostRow(key=k, usd=usd[k], gpu_hours=gpu_h[k], lost_gpu_hours=lost_h[k],
                    jobs=len(jobs[k]), lost_usd=lost_usd[k], idle_usd=idle[k]) for k in usd]
    return sorted(rows, key=lambda r: (-r.usd, r.key))


def lost_attempts(s: Session, since: float | None = None,
                  until: float | None = None) -> list[tuple[Attempt, Job, float]]:
    """Attempts that lost work and ended in [since, until), with the USD per GPU-second their
    GPUs were charged (0 when the ledger has not charged them)."""
    q = select(Attempt, Job).join(Job, Job.id == Attempt.job_id).where(Attempt.lost_gpu_s > 0)
    if since is not None:
        q = q.where(col(Attempt.ended_at) >= since)
    if until is not None:
        q = q.where(col(Attempt.ended_at) < until)
    rows = s.exec(q).all()
    rates = attempt_rates(s, [a.id for a, _ in rows if a.id is not None])
    return [(a, j, rates.get(a.id or 0, 0.0)) for a, j in rows]


def attempt_rates(s: Session, attempt_ids: list[int]) -> dict[int, float]:
    """USD per GPU-second each attempt's GPUs were charged on average (GPU rows only)."""
    usd: dict[int, float] = defaultdict(float)
    gpu_s: dict[int, float] = defaultdict(float)
    if attempt_ids:
        for r in s.exec(select(LedgerEntry).where(col(LedgerEntry.attempt_id).in_(attempt_ids),
                                                  LedgerEntry.kind == "gpu")):
            usd[r.attempt_id or 0] += r.usd
            gpu_s[r.attempt_id or 0] += r.gpus * (r.end - r.start)
    return {k: usd[k] / gpu_s[k] for k in usd if gpu_s[k] > 0}


def attempt_costs(s: Session, job_id: int) -> dict[int, float]:
    """USD charged per attempt id of one job (GPU share and egress)."""
    out: dict[int, float] = defaultdict(float)
    for aid, usd in s.exec(select(LedgerEntry.attempt_id, LedgerEntry.usd)
                           .where(LedgerEntry.job_id == job_id)):
        out[aid or 0] += usd
    return dict(out)


def total_usd(s: Session, since: float | None = None, until: float | None = None,
              pools: list[str] | None = None) -> float:
    """Everything charged in the window (jobs, idle and egress), optionally for some pools."""
    return sum(r.usd for r in costs(s, "pool", since, until) if pools is None or r.key in pools)


def burn_rate(s: Session, now: float, window_s: float = 3600.0) -> float:
    """USD per hour over the last `window_s` seconds (all pools)."""
    return total_usd(s, now - window_s, now) * 3600.0 / window_s

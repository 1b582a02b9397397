"""Cost queries over the ledger (broker/state/ledger.py): the one place the CLI, the SDK and the
dashboard read money from.

`costs(s, by=..., since=, until=)` groups charged USD by experiment, team, job, array, user
(`team/user` of the person who submitted the job, `team/(team token)` for a token without a
user; issue 28), pool, market or (UTC) day. One total, many views: every ledger row lands
under exactly one key of every view, so all views of one window sum to the same total.

- Rows spanning [start, end] are pro-rated to the part inside [since, until) (and, by day, to
  each UTC day they cover).
- GPU time nobody's job used has its own rows where a view has no owner for it:
  "idle on-prem", "idle rented" (an up node's unused GPUs) and "boot/drain" (a rented node
  before it was ready, and from an interruption notice or the decision to give it back to its
  confirmed termination). With `broker.idle_charged_to: launcher` the rented ones belong to
  the launching team in the team view. The names hold a space, so no experiment, team or job
  can take them.
- Checkpoint egress and storage are charged to the job whose checkpoint it is (its experiment
  and team). By market they are "egress" and "storage"; by pool, storage whose writing pool is
  unknown is "checkpoint storage".
- `gpu_hours` counts GPU-hours jobs held (idle GPUs are money, not work); `idle_usd` is the
  USD of unused GPU time (idle, boot, drain) under the key.
- `lost_gpu_hours` / `lost_usd`: work lost by attempts that ended in the window, valued at
  what those very GPUs were charged (the attempt's USD per GPU-second). Lost work is a
  valuation of money already charged, not a charge: it is not part of the total.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlmodel import Session, col, select

from broker.state.model import Attempt, Job, LedgerEntry, Pool
from broker.wire import CostRow

CostBy = Literal["experiment", "team", "job", "pool", "market", "day", "array", "user"]
COST_BY: tuple[str, ...] = ("experiment", "team", "job", "pool", "market", "day", "array", "user")
IDLE_ONPREM, IDLE_RENTED, BOOT_DRAIN = "idle on-prem", "idle rented", "boot/drain"
UNOWNED = (IDLE_ONPREM, IDLE_RENTED, BOOT_DRAIN)
NO_POOL = "checkpoint storage"


def check_by(by: str) -> None:
    """Raises ValueError naming the allowed groupings."""
    if by not in COST_BY:
        raise ValueError(f"by must be one of {', '.join(COST_BY)} (got {by!r})")


def _key(by: str, r: LedgerEntry, market: str) -> str:
    """The key of ledger row `r` (its pool's market given) in view `by` (not "day")."""
    if by == "pool":
        return r.pool or NO_POOL
    if by == "market":
        return r.kind if r.kind in ("egress", "storage") else market
    if r.job_id is not None:
        return {"experiment": r.experiment or "default", "team": r.team or "",
                "job": str(r.job_id), "array": str(r.job_id), "user": str(r.job_id)}[by]
    if by == "team" and r.team:
        return r.team  # unused rented time charged to the launching team
    if r.kind == "idle":
        return IDLE_ONPREM if market == "onprem" else IDLE_RENTED
    return BOOT_DRAIN


def array_keys(s: Session) -> dict[int, str]:
    """The `--by array` key of every array element: "array N" (a job not in an array is keyed
    by its id, as `--by job` does)."""
    return {jid: f"array {aid}" for jid, aid in s.exec(select(Job.id, Job.array_id).where(
        col(Job.array_id).is_not(None))).all() if jid is not None}


def user_key(team: str, user: str | None) -> str:
    """The `--by user` key of a job of `team` submitted by `user`."""
    return f"{team}/{user or '(team token)'}"


def user_keys(s: Session, team: str | None = None) -> dict[int, str]:
    """The `--by user` key of every job (of `team` only, if given)."""
    q = select(Job.id, Job.team, Job.user)
    if team is not None:
        q = q.where(Job.team == team)
    return {jid: user_key(t, u) for jid, t, u in s.exec(q).all() if jid is not None}


def _share(r: LedgerEntry, lo: float, hi: float, since: float | None, until: float | None) -> float:
    """The fraction of row r's [start, end] that lies in [lo, hi] and in [since, until) (an
    instant row: 1 or 0)."""
    if r.end <= r.start:
        return 1.0 if (since is None or r.start >= since) and (until is None or r.start < until) else 0.0
    a = lo if since is None else max(lo, since)
    b = hi if until is None else min(hi, until)
    return max(0.0, b - a) / (r.end - r.start)


def day_of(t: float) -> str:
    """The UTC date of `t`, ISO (the `--by day` key)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def _days(start: float, end: float) -> Iterator[tuple[str, float, float]]:
    """(UTC day, lo, hi) pieces of [start, end]; an instant is one piece."""
    if end <= start:
        yield day_of(start), start, end
        return
    t = start
    while t < end:
        d = datetime.fromtimestamp(t, UTC)
        nxt = (d.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)).timestamp()
        hi = min(end, nxt)
        yield day_of(t), t, hi
        t = hi


def costs(s: Session, by: CostBy = "experiment", since: float | None = None,
          until: float | None = None) -> list[CostRow]:
    """USD, GPU-hours and lost work per key, most expensive first. Raises ValueError for a
    `by` other than experiment, team, job, pool, market, day."""
    check_by(by)
    q = select(LedgerEntry)
    if until is not None:
        q = q.where(LedgerEntry.start < until)
    if since is not None:
        q = q.where(LedgerEntry.end >= since)
    market = {p.name: p.market for p in s.exec(select(Pool)).all()}
    # issue 29: an array's elements together; issue 28: a person's jobs together
    group = array_keys(s) if by == "array" else user_keys(s) if by == "user" else {}
    usd: dict[str, float] = defaultdict(float)
    idle: dict[str, float] = defaultdict(float)
    gpu_h: dict[str, float] = defaultdict(float)
    jobs: dict[str, set[int]] = defaultdict(set)
    for r in s.exec(q).all():
        if by == "day":
            pieces = [(k, _share(r, lo, hi, since, until)) for k, lo, hi in _days(r.start, r.end)]
        else:
            key = _key(by, r, market.get(r.pool, ""))
            if by in ("array", "user") and r.job_id is not None:
                key = group.get(r.job_id, key)
            pieces = [(key, _share(r, r.start, r.end, since, until))]
        for key, f in pieces:
            if f <= 0:
                continue
            usd[key] += r.usd * f
            if r.kind in ("boot", "idle", "drain"):
                idle[key] += r.usd * f
            if r.kind == "gpu":
                gpu_h[key] += r.gpus * (r.end - r.start) * f / 3600.0
            if r.job_id is not None:
                jobs[key].add(r.job_id)
    lost_h: dict[str, float] = defaultdict(float)
    lost_usd: dict[str, float] = defaultdict(float)
    for a, j, rate in lost_attempts(s, since, until):
        key = {"pool": a.pool, "market": market.get(a.pool, ""), "experiment": j.experiment,
               "team": j.team, "job": str(j.id), "day": day_of(a.ended_at or a.started_at),
               "array": group.get(j.id or 0, str(j.id)), "user": user_key(j.team, j.user)}[by]
        lost_h[key] += a.lost_gpu_s / 3600.0
        lost_usd[key] += a.lost_gpu_s * rate
        jobs[key].add(j.id or 0)
        usd.setdefault(key, 0.0)
    rows = [CostRow(key=k, usd=usd[k], gpu_hours=gpu_h[k], lost_gpu_hours=lost_h[k],
                    jobs=len(jobs[k]), lost_usd=lost_usd[k], idle_usd=idle[k]) for k in usd]
    if by == "day":
        return sorted(rows, key=lambda r: r.key)
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
    """USD charged per attempt id of one job (GPU share, egress and storage of what it wrote)."""
    out: dict[int, float] = defaultdict(float)
    for aid, usd in s.exec(select(LedgerEntry.attempt_id, LedgerEntry.usd)
                           .where(LedgerEntry.job_id == job_id)):
        out[aid or 0] += usd
    return dict(out)


def total_usd(s: Session, since: float | None = None, until: float | None = None,
              pools: list[str] | None = None) -> float:
    """Everything charged in the window (jobs, unused GPU time, egress, storage), optionally
    for some pools."""
    return sum(r.usd for r in costs(s, "pool", since, until) if pools is None or r.key in pools)


def spent_last(s: Session, now: float, window_s: float = 3600.0) -> float:
    """USD charged over [now - window_s, now) (all pools)."""
    return total_usd(s, now - window_s, now)


def burn_rate(s: Session, now: float, window_s: float = 3600.0) -> float:
    """USD per hour over the last `window_s` seconds (all pools): what was charged in that
    window, divided by its length."""
    return spent_last(s, now, window_s) * 3600.0 / window_s

"""The ledger of lost work: why each attempt ended, what it lost, and who caused it.

Per attempt (columns of Attempt, set by the engine):

- `cause`: why it ended, if it did not complete: `preempted_by=<job id>`,
  `spot_interruption` (or the cause an interruption notice named), `node_failure` (its
  processes vanished), `server_unreachable` (its ranks stopped themselves: their node could
  not reach the server for the fence time, an outage's loss that no team caused), `budget`,
  `cancelled`, or `failed`.
- `lost_gpu_s`: GPU-seconds of work lost: (end - its last committed checkpoint seen, or its
  start if it saved none) x its GPUs, on the broker's clock.
- `restart_overhead_s`: from its start to its first new step (the runtime's progress
  marker, or its first new checkpoint, whichever the broker saw first).
- `restore_bytes`, `egress_bytes`, `egress_usd`: the checkpoint it resumed from, and what
  was copied across stores for it.

A lost attempt also costs the restart of the next one (its restart phases, broker.phases, up
to its first new step): `lost_work` rows carry it as `restart_gpu_s` beside `lost_gpu_s` (the
work since the last checkpoint), charged to the same key.

The lost GPU-seconds of a preemption are charged to the preempting job and its team:
`lost_work(s, by="team")` answers "whose urgent work cost how many GPU-hours of others' work".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from sqlmodel import Session, col, select

from broker.state.costs import user_key
from broker.state.model import Attempt, EndReason, Job
from broker.state.views import LostWorkRow

By = Literal["team", "job", "cause", "user"]
LOST_BY: tuple[str, ...] = ("team", "job", "cause", "user")


def cause_of(a: Attempt, reason: EndReason) -> str | None:
    """Why an attempt ended (None: it completed)."""
    if reason == EndReason.COMPLETED:
        return None
    if reason == EndReason.PREEMPTED:
        return f"preempted_by={a.preempted_by}"
    if reason == EndReason.INTERRUPTED:
        return a.cause or "spot_interruption"
    if reason == EndReason.LOST:
        return a.cause or "node_failure"
    if reason == EndReason.CANCELLED:
        return "cancelled"
    if reason == EndReason.REBALANCED:
        return "rebalanced"
    return "budget" if a.stop_reason == "budget" else "failed"


def cause_kind(cause: str | None) -> str:
    """The cause without its argument: `preempted_by=7` -> `preempted`."""
    if cause is None:
        return "completed"
    return "preempted" if cause.startswith("preempted_by=") else cause


def lost_work(s: Session, by: By = "team") -> list[LostWorkRow]:
    """Lost GPU-hours, most first.

    by="team" / "job" / "user": the work lost to preemptions, charged to the preempting team /
    job / person (`team/user`, broker.state.costs.user_key).
    by="cause": every attempt's lost work by cause kind (preempted, spot_interruption, ...).
    Each row's `restart_gpu_s`: the GPU-seconds the next attempts of its victims spent restarting.
    """
    if by not in LOST_BY:
        raise ValueError(f"by must be one of {', '.join(LOST_BY)} (got {by!r})")
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    victims: dict[str, set[int]] = defaultdict(set)
    if by == "cause":
        rows = s.exec(select(Attempt).where(col(Attempt.cause).is_not(None))).all()
        keyed = [(cause_kind(a.cause), a) for a in rows]
    else:
        rows2 = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.preempted_by)
                       .where(Attempt.end_reason == EndReason.PREEMPTED)).all()
        keyed = [(j.team if by == "team" else user_key(j.team, j.user) if by == "user" else str(j.id), a)
                 for a, j in rows2]
    restart = _restart_gpu_s(s, {a.job_id for _, a in keyed})
    for key, a in keyed:
        acc[key][0] += a.lost_gpu_s
        acc[key][1] += 1
        acc[key][2] += restart.get((a.job_id, a.number + 1), 0.0)
        victims[key].add(a.job_id)
    out = [LostWorkRow(key=k, lost_gpu_s=v[0], lost_gpu_hours=v[0] / 3600.0, attempts=int(v[1]),
                       victims=sorted(victims[k]), restart_gpu_s=v[2]) for k, v in acc.items()]
    return sorted(out, key=lambda r: (-r.lost_gpu_s, r.key))


def _restart_gpu_s(s: Session, job_ids: set[int]) -> dict[tuple[int, int], float]:
    """(job, attempt number) -> GPU-seconds its restart took: from its start to its first new
    step (restart_overhead_s: fetch code, pull image, setup, fetch data, restore, the job's own
    start-up; broker.phases) x its GPUs. Lost to whatever ended the attempt before it."""
    if not job_ids:
        return {}
    rows = s.exec(select(Attempt.job_id, Attempt.number, Attempt.restart_overhead_s, Attempt.gpus)
                  .where(col(Attempt.job_id).in_(sorted(job_ids)),
                         col(Attempt.restart_overhead_s).is_not(None)))
    return {(j, n): float(r or 0.0) * g for j, n, r, g in rows}


def caused_lost_gpu_s(s: Session, job_ids: list[int]) -> dict[int, float]:
    """Per job: the GPU-seconds other jobs lost because it preempted them."""
    out: dict[int, float] = defaultdict(float)
    if job_ids:
        for by, lost in s.exec(select(Attempt.preempted_by, Attempt.lost_gpu_s).where(
                col(Attempt.preempted_by).in_(job_ids), Attempt.end_reason == EndReason.PREEMPTED)):
            out[by] += lost
    return dict(out)

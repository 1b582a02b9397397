"""Pending jobs the plan does not see this cycle (issue 29), read from the database and decided
by pure rules: a retry's backoff (broker.control.retries), an array's limit of elements running
at once (broker.policy.arrays.throttle).

`hold(snap, s)` returns the snapshot without the held jobs, and why each waits (the engine
shows it as the job's waiting reason).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from sqlmodel import Session, col, select

from broker.policy import Snapshot
from broker.policy.arrays import Member, throttle
from broker.state.model import Attempt, AttemptState, Job


def array_members(s: Session, pending: list[int]) -> tuple[dict[int, Member], dict[int, int]]:
    """The throttled array elements among `pending` job ids, and per such array how many of
    its elements have an attempt not ended."""
    members: dict[int, Member] = {}
    if not pending:
        return members, {}
    rows = s.exec(select(Job.id, Job.array_id, Job.array_index, Job.array_limit).where(
        col(Job.id).in_(pending), col(Job.array_limit).is_not(None))).all()
    for jid, aid, index, limit in rows:
        if aid is not None and jid is not None:
            members[jid] = Member(aid, index or 0, limit)
    running: dict[int, int] = defaultdict(int)
    if members:
        arrays = {m.array_id for m in members.values()}
        for aid in s.exec(select(Job.array_id).join(Attempt, Attempt.job_id == Job.id).where(
                col(Job.array_id).in_(arrays), Attempt.state != AttemptState.ENDED)).all():
            if aid is not None:
                running[aid] += 1
    return members, dict(running)


def backing_off(s: Session, pending: list[int], now: float) -> dict[int, str]:
    """The `pending` jobs whose retry backoff (broker.control.retries) lasts past `now`."""
    if not pending:
        return {}
    rows = s.exec(select(Job.id, Job.not_before, Job.retried, Job.retries).where(
        col(Job.id).in_(pending), col(Job.not_before) > now)).all()
    return {jid: f"retry {done} of {allowed} after a failure: starts no sooner than "
                 f"{until - now:.0f}s from now (backoff)"
            for jid, until, done, allowed in rows if jid is not None and until is not None}


def hold(snap: Snapshot, s: Session) -> tuple[Snapshot, dict[int, str]]:
    """`snap` without the pending jobs held back this cycle, and why each one waits."""
    ids = [p.job_id for p in snap.pending]
    held = backing_off(s, ids, snap.now)
    ids = [i for i in ids if i not in held]
    members, running = array_members(s, ids)
    held.update(throttle(ids, members, running))
    if not held:
        return snap, {}
    return replace(snap, pending=tuple(p for p in snap.pending if p.job_id not in held),
                   queue=None), held

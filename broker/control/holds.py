"""Pending jobs the plan does not see this cycle (issue 29), read from the database and decided
by pure rules: a hold (`onepool hold`, issue 28: never placed until released), a retry's
backoff (broker.control.retries), dependencies not met yet
(broker.policy.dependencies.resolve), an array's limit of elements running at once
(broker.policy.arrays.throttle).

`hold(snap, s)` returns the snapshot without the held jobs, and why each waits (the engine
shows it as the job's waiting reason). `end_never_met(s, now)` ends the pending jobs whose
dependencies can never be met, FAILED with an event naming the dependency.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlmodel import Session, col, select

from broker.policy import Snapshot
from broker.policy.arrays import Member, throttle
from broker.policy.dependencies import DependencyState, resolve
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, Job, JobState

COLUMNS = (Job.id, Job.array_id, Job.array_index, Job.array_limit, Job.not_before, Job.retried,
           Job.retries, Job.after, Job.held_by)  # what the holds read of a pending job


@dataclass(frozen=True)
class Waiting:
    """What of the pending jobs the holds read, in one query."""

    members: dict[int, Member]  # throttled array elements
    backoff: dict[int, tuple[float, int, int]]  # job -> (not_before, retried, retries)
    after: dict[int, list[tuple[int, str]]]  # job -> its dependencies
    held: dict[int, str]  # job -> who put it on hold (issue 28)

    @classmethod
    def read(cls, s: Session) -> Waiting:
        return cls.of(s.exec(select(*COLUMNS).where(Job.state == JobState.PENDING)).all())

    @classmethod
    def of(cls, rows: Iterable[Sequence[Any]]) -> Waiting:
        """From the pending jobs' COLUMNS (read now, or kept by broker.control.kept)."""
        members: dict[int, Member] = {}
        backoff: dict[int, tuple[float, int, int]] = {}
        after: dict[int, list[tuple[int, str]]] = {}
        held: dict[int, str] = {}
        for jid, aid, index, limit, not_before, retried, retries, deps, held_by in rows:
            assert jid is not None
            if held_by is not None:
                held[jid] = held_by
            if aid is not None and limit is not None:
                members[jid] = Member(aid, index or 0, limit)
            if not_before is not None:
                backoff[jid] = (not_before, retried, retries)
            if deps:
                after[jid] = [(int(d), str(c)) for d, c in deps]
        return cls(members, backoff, after, held)


def dependencies(s: Session, after: dict[int, list[tuple[int, str]]]) -> dict[int, DependencyState]:
    """Where each job with dependencies stands (broker.policy.dependencies.resolve)."""
    ids = {d for deps in after.values() for d, _ in deps}
    if not ids:
        return {}
    states = {jid: str(st) for jid, st in s.exec(select(Job.id, Job.state).where(col(Job.id).in_(ids))).all()
              if jid is not None}
    return {jid: resolve(deps, states) for jid, deps in after.items()}


def running_per_array(s: Session, arrays: set[int]) -> dict[int, int]:
    """Per array id, its elements with an attempt not ended."""
    running: dict[int, int] = defaultdict(int)
    if arrays:
        for aid in s.exec(select(Job.array_id).join(Attempt, Attempt.job_id == Job.id).where(
                col(Job.array_id).in_(arrays), Attempt.state != AttemptState.ENDED)).all():
            if aid is not None:
                running[aid] += 1
    return dict(running)


def hold(snap: Snapshot, s: Session, w: Waiting | None = None) -> tuple[Snapshot, dict[int, str]]:
    """`snap` without the pending jobs held back this cycle, and why each one waits. `w`:
    what the holds read of the pending jobs, when the caller keeps it (else read now)."""
    if w is None:
        w = Waiting.read(s)
    now = snap.now
    held = {jid: hold_reason(by, jid) for jid, by in w.held.items()}
    for jid, (until, done, allowed) in w.backoff.items():
        if until > now:
            held.setdefault(jid, f"retry {done} of {allowed} after a failure: starts no sooner "
                                 f"than {until - now:.0f}s from now (backoff)")
    for jid, st in dependencies(s, w.after).items():
        if not st.met:
            held.setdefault(jid, st.waiting or f"dependency never met: {st.never}")
    ids = [p.job_id for p in snap.pending if p.job_id not in held] if w.members else []
    running = running_per_array(s, {m.array_id for m in w.members.values()})
    held.update(throttle(ids, w.members, running))
    if not held:
        return snap, {}
    return replace(snap, pending=tuple(p for p in snap.pending if p.job_id not in held),
                   queue=None), held


def hold_reason(held_by: str, job_id: int) -> str:
    """A held job's "why waiting"."""
    return f"on hold (by {held_by}): never placed until `onepool release {job_id}`"


def end_never_met(s: Session, now: float, w: Waiting | None = None) -> list[int]:
    """End FAILED every pending job a dependency of which can never be met (the job it names
    ended otherwise than it needed), with a `dependency_never_met` event naming it. Returns
    their ids; the caller commits. `w`: the pending jobs' holds as the caller keeps them
    (else read now); after a job is ended here they are read again."""
    ended: list[int] = []
    while True:  # a job ended here may doom the jobs that wait for it: to a fixed point
        now_ended = []
        if w is None:
            w = Waiting.read(s)
        for jid, st in dependencies(s, w.after).items():
            job = s.get(Job, jid) if st.never else None
            if job is None or job.state != JobState.PENDING:
                continue
            job.state, job.end_time, job.waiting_reason = JobState.FAILED, now, None
            s.add(job)
            record(s, now, "dependency_never_met", f"ended: its dependency can never be met: "
                   f"{st.never}", job_id=jid)
            now_ended.append(jid)
        if not now_ended:
            return ended
        w = None
        s.flush()
        ended += now_ended

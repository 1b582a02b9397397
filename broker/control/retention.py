"""Retention: keep the newest K committed checkpoints of every job; delete the rest, and
abandoned uploads, after a safety delay measured on the broker's clock.

Rules (`due`, pure):

- The newest `keep` intact committed steps of a job are kept, in every store that holds
  them. A committed (or damaged) step older than all of them is deleted once it has been
  out of that window for `delay_s`: counted from when the K-th newer intact step was first
  seen. Damaged steps newer than that stay (they are skipped on resume, and kept for a look).
- A step folder without a manifest is abandoned, and deleted, once it has been seen without
  one for `delay_s` and nobody can still be writing it: no attempt of the job is running
  in that store, or a newer step there is committed (uploads commit in order).
- Never deleted: the step a running or launching attempt restored from.

`run` applies it: it re-checks a "partial" folder for a manifest before deleting it (a
slow upload that finished is indexed instead: damaged if its manifest breaks the rules of
broker.checkpoint.names), deletes the manifest first, and records one
event per job and sweep. Store errors are logged and retried on the next cycle.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sqlmodel import Session, col, select

from broker.checkpoint.checkpoints import CheckpointStore, store_root_of
from broker.checkpoint.index import attempt_prefix
from broker.errors import CheckpointError
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, Checkpoint, CheckpointState, Job

log = logging.getLogger("onepool.retention")
C, D, P = CheckpointState.COMMITTED, CheckpointState.DAMAGED, CheckpointState.PARTIAL


@dataclass(frozen=True)
class Item:
    id: int
    job_id: int
    store: str
    step: int
    state: str
    observed_at: float


def due(items: Iterable[Item], *, keep: int, delay_s: float, now: float,
        protected: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
        writing: set[tuple[int, str]] = frozenset()) -> list[Item]:  # type: ignore[assignment]
    """The items to delete now (see the module docstring). `protected`: (job, step) pairs;
    `writing`: (job, store) pairs an active attempt writes to."""
    by_job: dict[int, list[Item]] = defaultdict(list)
    for it in items:
        by_job[it.job_id].append(it)
    out: list[Item] = []
    for job_id, its in by_job.items():
        seen: dict[int, float] = {}
        for it in its:
            if it.state == C:
                seen[it.step] = min(it.observed_at, seen.get(it.step, it.observed_at))
        intact = sorted(seen)  # ascending
        if len(intact) > keep:
            floor = intact[-keep]
            for it in its:
                if it.state not in (C, D) or it.step >= floor or (job_id, it.step) in protected:
                    continue
                newer = [s for s in intact if s > it.step]
                if now - seen[newer[keep - 1]] >= delay_s:
                    out.append(it)
        for it in its:
            if it.state != P or now - it.observed_at < delay_s:
                continue
            newer_here = any(o.state == C and o.store == it.store and o.step > it.step for o in its)
            if (job_id, it.store) not in writing or newer_here:
                out.append(it)
    return sorted(out, key=lambda i: (i.job_id, i.store, i.step))


def run(s: Session, now: float, *, keep: int, delay_s: float) -> list[Item]:
    """Apply retention to every job; returns what was deleted."""
    rows = {r.id: r for r in s.exec(select(Checkpoint).where(col(Checkpoint.state).in_([C, D, P])))}
    if not rows:
        return []
    protected: set[tuple[int, int]] = set()
    writing: set[tuple[int, str]] = set()
    for a, j in s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
                       .where(Attempt.state != AttemptState.ENDED)):
        if a.restored_step is not None:
            protected.add((j.id, a.restored_step))
        writing.add((j.id, store_root_of(attempt_prefix(j, a))))
    items = [Item(r.id, r.job_id, r.store, r.step, r.state, r.observed_at)
             for r in rows.values() if r.id is not None]
    deleted: list[Item] = []
    for it in due(items, keep=keep, delay_s=delay_s, now=now, protected=protected, writing=writing):
        row = rows[it.id]
        try:
            if _delete(row, now):
                deleted.append(it)
        except (OSError, CheckpointError) as e:
            log.warning("retention: cannot delete %s (%s); will retry", row.uri, e)
    _report(s, now, deleted, keep)
    return deleted


def _delete(row: Checkpoint, now: float) -> bool:
    prefix, _ = row.uri.rstrip("/").rsplit("/", 1)
    st = CheckpointStore(prefix)
    if row.state == P:
        m = st.manifest(row.step)
        if m is not None and m.problems:  # committed, but breaking the rules on names: damaged
            row.state, row.observed_at = D, now
            return False
        if m is not None:  # a slow upload finished after all: index it, keep it
            row.state, row.observed_at, row.written_at, row.bytes = C, now, m.time, m.bytes
            return False
    st.delete(row.step)
    row.state = CheckpointState.ABANDONED if row.state == P else CheckpointState.DELETED
    row.deleted_at = now
    return True


def _report(s: Session, now: float, deleted: list[Item], keep: int) -> None:
    by_job: dict[int, list[Item]] = defaultdict(list)
    for it in deleted:
        by_job[it.job_id].append(it)
    for job_id, its in by_job.items():
        old = [i.step for i in its if i.state != P]
        partial = [i.step for i in its if i.state == P]
        parts = []
        if old:
            parts.append(f"deleted steps {old} (keeping the newest {keep})")
        if partial:
            parts.append(f"deleted abandoned uploads of steps {partial}")
        record(s, now, "checkpoint_retention", "; ".join(parts), job_id=job_id,
               deleted_steps=old, abandoned_steps=partial)

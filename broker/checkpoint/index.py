"""The broker's index of checkpoints (the Checkpoint table), kept in step with object storage.

Object storage is the truth; this index remembers what the broker saw and when, on the
broker's clock: a step's `observed_at` is when a commit (or a step folder without a
manifest) was first seen, which is what lost-work, restart-overhead and retention timing
are measured against. One row per (job, store, step): a checkpoint copied to another
store is a second row.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from sqlmodel import Session, col, select

from broker.checkpoint.checkpoints import MAX_STEP, CheckpointStore, Manifest, job_prefix, store_root_of
from broker.spec import ClusterConfig
from broker.state.model import Attempt, AttemptState, Checkpoint, CheckpointState, Job
from pricing.egress import Location, provider_of

log = logging.getLogger("onepool.checkpoints")

LIVED = (CheckpointState.COMMITTED, CheckpointState.DAMAGED, CheckpointState.DELETED)
"""States of a row that was a committed checkpoint at some point."""


def default_store_root(config: ClusterConfig, home: Path) -> str:
    """The broker-wide store: `broker.checkpoint_store`, else a folder in the broker home."""
    return config.broker.checkpoint_store or f"file://{home / 'checkpoints'}"


def pool_store_root(config: ClusterConfig, pool: str, home: Path) -> str:
    """Where attempts in `pool` write: the pool's `store`, else the broker-wide store."""
    return config.pool(pool).store or default_store_root(config, home)


def locate(config: ClusterConfig, store_root: str) -> Location:
    """A store's provider (from its scheme) and region (of the pools that name it, if one)."""
    regions = {p.region for p in config.pools if p.store == store_root}
    return Location(provider_of(store_root), regions.pop() if len(regions) == 1 else None)


def attempt_prefix(job: Job, a: Attempt) -> str:
    return a.checkpoint_uri or job.checkpoint_uri


def job_prefixes(s: Session, job: Job) -> list[str]:
    """Every prefix that may hold the job's checkpoints: its current one, its attempts' and
    every store its indexed checkpoints lived in (current first, then as first used)."""
    out = [job.checkpoint_uri]
    for a in s.exec(select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)):
        out.append(attempt_prefix(job, a))
    for root in s.exec(select(Checkpoint.store).where(Checkpoint.job_id == job.id,
                                                       col(Checkpoint.state).in_(LIVED))):
        out.append(job_prefix(root, job.team, job.experiment, job.id))
    return list(dict.fromkeys(p for p in out if p))


PROGRESS_READ_S = 15.0  # read a running attempt's progress marker this often (and on a new commit)


def refresh_attempt(s: Session, job: Job, a: Attempt, now: float) -> list[Manifest]:
    """Index what the attempt's store holds now; returns the newly committed manifests.

    New commits whose manifest names this attempt (or no attempt) advance the attempt's and
    the job's newest step and last-checkpoint time; a manifest that breaks the rules of
    broker.checkpoint.names is indexed DAMAGED and advances nothing. A step folder without a manifest gets a
    PARTIAL row stamped with when it was first seen. The attempt's first new step (its
    progress marker, or its first new commit) sets its restart overhead.
    """
    prefix = attempt_prefix(job, a)
    root = store_root_of(prefix)
    st = CheckpointStore(prefix)
    known = {r.step: r for r in s.exec(select(Checkpoint).where(
        Checkpoint.job_id == job.id, Checkpoint.store == root))}
    new: list[Manifest] = []
    for step in st.steps():
        row = known.get(step)
        if row is not None and row.state != CheckpointState.PARTIAL:
            continue
        m = st.manifest(step)
        if m is None:
            if row is None:
                s.add(Checkpoint(job_id=job.id, step=step, uri=st.step_uri(step), observed_at=now,
                                 store=root, state=CheckpointState.PARTIAL))
            continue
        row = row or Checkpoint(job_id=job.id, step=step, uri=m.uri, observed_at=now, store=root)
        if m.problems:  # a manifest that breaks the rules on names and sizes: never progress
            row.state, row.observed_at, row.written_at = CheckpointState.DAMAGED, now, m.time
            s.add(row)
            log.warning("job %s: step %s at %s is damaged: %s", job.id, step, root, "; ".join(m.problems))
            continue
        mine = m.attempt in (None, a.number)
        row.state, row.observed_at, row.written_at, row.bytes = (
            CheckpointState.COMMITTED, now, m.time, m.bytes)
        row.attempt_id, row.copied_from, row.save_s = (a.id if mine else None), m.copied_from, m.save_s
        s.add(row)
        new.append(m)
    mine_steps = [m.step for m in new if m.attempt in (None, a.number) and m.copied_from is None]
    if mine_steps:
        a.reached_step = max([*mine_steps, a.reached_step if a.reached_step is not None else -1])
        a.last_checkpoint_at = now
        job.last_step, job.last_checkpoint_at = a.reached_step, now
    if a.state != AttemptState.LAUNCHING and (a.first_step_at is None or a.progress_read_at is None
                                              or mine_steps or now - a.progress_read_at >= PROGRESS_READ_S):
        _read_progress(st, a, now)
    if a.first_step_at is None and (mine_steps or a.progress_step is not None):
        a.first_step_at = now
        a.restart_overhead_s = now - a.started_at
    s.add(a)
    s.add(job)
    return new


def declared_done(job: Job, a: Attempt) -> bool:
    """Whether every rank of the attempt declared itself done (runtime.done() records it in
    the attempt's store, which outlives its node). False when the store cannot be read."""
    try:
        return CheckpointStore(attempt_prefix(job, a)).all_done(a.number, len(a.alloc))
    except OSError as e:
        log.warning("job %s: cannot read the done markers of attempt %s (%s)", job.id, a.number, e)
        return False


def _read_progress(st: CheckpointStore, a: Attempt, now: float) -> None:
    """Copy the attempt's progress marker (broker.runtime.progress) onto it: its newest step,
    the total it announced, when, and its steps per second over this attempt."""
    m = st.progress(a.number)
    a.progress_read_at = now
    if m is None:
        return
    try:
        step, at = int(m["step"]), float(m["time"])
        total = None if m.get("total") is None else int(m["total"])
        first_step, first_time = int(m.get("first_step", step)), float(m.get("first_time", at))
    except (KeyError, TypeError, ValueError, OverflowError):  # written by a job: ignore garbage
        return
    if not (all(0 <= n <= MAX_STEP for n in (step, first_step, total or 0))
            and math.isfinite(at) and math.isfinite(first_time)):
        return  # a number no database column holds, or NaN: garbage too
    a.progress_step, a.progress_total, a.progress_at = step, total, at
    if step > first_step and at > first_time:
        a.progress_rate = (step - first_step) / (at - first_time)


def record_copy(s: Session, job: Job, a: Attempt, m: Manifest, root: str, now: float) -> None:
    """Index a checkpoint the broker copied into `root` for attempt `a`."""
    row = s.exec(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.store == root,
                                          Checkpoint.step == m.step)).first()
    row = row or Checkpoint(job_id=job.id, step=m.step, uri=m.uri, observed_at=now, store=root)
    row.state, row.written_at, row.bytes, row.copied_from = (
        CheckpointState.COMMITTED, m.time, m.bytes, m.copied_from)
    row.attempt_id, row.uri = a.id, m.uri
    s.add(row)


def mark_damaged(s: Session, job_id: int, root: str, step: int) -> None:
    row = s.exec(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.store == root,
                                          Checkpoint.step == step)).first()
    if row is not None and row.state == CheckpointState.COMMITTED:
        row.state = CheckpointState.DAMAGED
        s.add(row)


def stores_of(s: Session, job_ids: list[int]) -> dict[int, list[str]]:
    """Per job, the distinct store roots its committed checkpoints lived in, first used first."""
    out: dict[int, list[str]] = {}
    if not job_ids:
        return out
    rows = s.exec(select(Checkpoint.job_id, Checkpoint.store)
                  .where(col(Checkpoint.job_id).in_(job_ids), col(Checkpoint.state).in_(LIVED))
                  .order_by(Checkpoint.observed_at, Checkpoint.id)).all()
    for job_id, root in rows:
        lst = out.setdefault(job_id, [])
        if root not in lst:
            lst.append(root)
    return out

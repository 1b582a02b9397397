"""Checkpoint storage on the ledger: what keeping each checkpoint in its store costs.

Contract: every checkpoint the broker has seen committed (Checkpoint rows COMMITTED, DAMAGED,
or DELETED by retention) with a known size is one "storage" LedgerEntry, charged to its job,
team and experiment, over [first seen committed, deleted] (or up to the last accrual while it
still exists), at its store's list price per GiB-month (pricing.storage). Finished jobs'
kept checkpoints keep costing money until retention deletes them, as they do on the bill.
The row's `pool` is the pool of the attempt that wrote (or copied) it, "" when unknown.

`accrue_storage` runs inside `broker.state.ledger.accrue`; extending the open rows is one
UPDATE statement, so a cycle's cost does not grow with the number of checkpoints kept.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import Session, col, select

from broker.state.model import Attempt, Checkpoint, CheckpointState, Job, LedgerEntry
from pricing.egress import GIB
from pricing.storage import rate_of

KEPT = (CheckpointState.COMMITTED, CheckpointState.DAMAGED)  # still in the store


def accrue_storage(s: Session, now: float) -> None:
    """Charge checkpoint storage up to `now`: open a row for each newly seen checkpoint, close
    rows of deleted ones at their deletion, extend the rest to `now`."""
    charged = select(LedgerEntry.checkpoint_id).where(LedgerEntry.kind == "storage",
                                                      col(LedgerEntry.checkpoint_id).is_not(None))
    new = s.exec(select(Checkpoint, Job).join(Job, Job.id == Checkpoint.job_id).where(
        Checkpoint.bytes > 0, col(Checkpoint.state).in_([*KEPT, CheckpointState.DELETED]),
        col(Checkpoint.id).not_in(charged))).all()
    pools = _attempt_pools(s, [c.attempt_id for c, _ in new if c.attempt_id is not None])
    for c, j in new:
        start = c.observed_at
        end = max(start, c.deleted_at if c.deleted_at is not None else now)
        gb = c.bytes / GIB
        rate = rate_of(c.store).usd_per_gib_hour
        s.add(LedgerEntry(kind="storage", pool=pools.get(c.attempt_id or 0, ""), job_id=j.id,
                          team=j.team, experiment=j.experiment, start=start, end=end, gb=gb,
                          usd_per_gpu_hour=rate, usd=gb * rate * (end - start) / 3600.0,
                          checkpoint_id=c.id, attempt_id=c.attempt_id))
    s.flush()
    for row, c in s.exec(select(LedgerEntry, Checkpoint).join(
            Checkpoint, Checkpoint.id == LedgerEntry.checkpoint_id).where(
            LedgerEntry.kind == "storage", Checkpoint.state == CheckpointState.DELETED,
            col(Checkpoint.deleted_at).is_not(None), LedgerEntry.end < Checkpoint.deleted_at)).all():
        _extend(row, c.deleted_at or row.end)
        s.add(row)
    kept = select(Checkpoint.id).where(col(Checkpoint.state).in_(KEPT))
    s.execute(update(LedgerEntry).where(
        LedgerEntry.kind == "storage", LedgerEntry.end < now, col(LedgerEntry.checkpoint_id).in_(kept))
        .values(usd=LedgerEntry.usd + LedgerEntry.gb * LedgerEntry.usd_per_gpu_hour
                * (now - LedgerEntry.end) / 3600.0, end=now)
        .execution_options(synchronize_session=False))


def _extend(row: LedgerEntry, end: float) -> None:
    row.usd += row.gb * row.usd_per_gpu_hour * (end - row.end) / 3600.0
    row.end = end


def _attempt_pools(s: Session, attempt_ids: list[int]) -> dict[int, str]:
    if not attempt_ids:
        return {}
    return {aid: pool for aid, pool in s.exec(select(Attempt.id, Attempt.pool)
                                              .where(col(Attempt.id).in_(attempt_ids)))}

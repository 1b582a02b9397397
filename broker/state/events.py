"""The event log: one row per thing that happened to a job, in the job's own words."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from broker.state.model import Event


def record(s: Session, now: float, kind: str, message: str, *, job_id: int | None = None,
           attempt_id: int | None = None, **data: Any) -> Event:
    """Add an event to the session (committed with the caller's transaction)."""
    ev = Event(time=now, job_id=job_id, attempt_id=attempt_id, kind=kind, message=message,
               data=data)
    s.add(ev)
    return ev

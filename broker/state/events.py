"""The event log: one row per thing that happened to a job, in the job's own words, with who
made it happen (`actor`).

The actor comes from the context: the SDK (embedded or behind the API) runs each call inside
`acting_as(principal.actor)`; anything outside such a block is the broker's own doing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlmodel import Session

from broker.state.model import Event

_ACTOR: ContextVar[str] = ContextVar("onepool_actor", default="broker")


@contextmanager
def acting_as(actor: str) -> Iterator[None]:
    """Events recorded inside this block name `actor` as who made the change."""
    tok = _ACTOR.set(actor)
    try:
        yield
    finally:
        _ACTOR.reset(tok)


def current_actor() -> str:
    return _ACTOR.get()


def event_row(now: float, kind: str, message: str, actor: str, *, job_id: int | None = None,
              attempt_id: int | None = None, **data: Any) -> dict[str, Any]:
    """An event as a row for a bulk insert (what record() adds, made by `actor`)."""
    return {"time": now, "job_id": job_id, "attempt_id": attempt_id, "kind": kind,
            "message": message, "data": data, "actor": actor}


def record(s: Session, now: float, kind: str, message: str, *, job_id: int | None = None,
           attempt_id: int | None = None, **data: Any) -> Event:
    """Add an event to the session (committed with the caller's transaction)."""
    ev = Event(time=now, job_id=job_id, attempt_id=attempt_id, kind=kind, message=message,
               data=data, actor=_ACTOR.get())
    s.add(ev)
    return ev

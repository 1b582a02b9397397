"""Recording an attempt's restart phases (broker.phases, issue 26): what its first rank's node
timed, read from local ranks' folders by the engine or reported by agents with their syncs.
Kept on the attempt (`phases`: None until read; re-read while setup is pending) and told once
in a `phases` event when complete."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from broker.phases import clean, describe
from broker.state.events import record
from broker.state.model import Attempt


def wants(a: Attempt) -> bool:
    """Whether the attempt's phases are still to be read."""
    return a.phases is None or bool(a.phases.get("pending"))


def note(s: Session, a: Attempt, raw: Any, now: float) -> None:
    """Keep what the node reported for the attempt's first rank; the event once complete."""
    got = clean(raw)
    if not wants(a):
        return
    a.phases = {**(a.phases or {}), **got}
    s.add(a)
    if not got.get("pending") and any(k.endswith("_s") for k in got):
        record(s, now, "phases", f"attempt {a.number} restart phases: {describe(got)}",
               job_id=a.job_id, attempt_id=a.id, **{k: v for k, v in got.items() if k.endswith("_s")})


def poll(s: Session, a: Attempt, executor: Any, now: float) -> None:
    """Read a local rank 0's phases when the executor keeps them on this host."""
    if not wants(a) or not a.handles:
        return
    read = getattr(executor, "phases", None)
    got = read(a.handles[0]) if read is not None else None
    if got is not None:
        note(s, a, got, now)

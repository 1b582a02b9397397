"""The broker's health as one value: computed from the lease row by `assess` (no database
import here: the fast `status` reader uses it too). See broker.control.health."""

from __future__ import annotations

from typing import Any

from broker.wire import Health


def assess(row: Any | None, lease_s: float, cycle_s: float, now: float) -> Health:
    """The broker's health at `now` from the lease row (holder, fencing, expires_at,
    renewed_at, cycled_at; None: no lease row) and the broker's lease and cycle periods."""
    stale_after = max(lease_s, 3 * cycle_s)
    if row is None:
        return Health(broker_up=False, leader=None, fencing=0, lease_expires_at=None,
                      last_cycle_at=None, last_cycle_age_s=None, stale_after_s=stale_after,
                      down_since=None, summary="no broker has ever run on this database")
    age = None if row.cycled_at is None else max(0.0, now - row.cycled_at)
    leased = row.holder is not None and row.expires_at > now
    up = leased and age is not None and age <= stale_after
    seen = [t for t in (row.renewed_at, row.cycled_at) if t is not None]
    down_since = None if up or not seen else max(seen)
    if up:
        summary = f"broker up: leader {row.holder} (fencing {row.fencing}), last cycle {age:.1f}s ago"
    elif leased:
        summary = (f"broker stuck: leader {row.holder} holds the lease but "
                   + ("has not finished a cycle" if age is None else f"its last cycle was {age:.0f}s ago"))
    elif down_since is None:
        summary = "no broker has ever run on this database"
    else:
        how = "stopped" if row.holder is None else f"lease of {row.holder} expired"
        summary = f"broker down for {max(0.0, now - down_since):.0f}s ({how})"
    return Health(broker_up=up, leader=row.holder if leased else None, fencing=row.fencing,
                  lease_expires_at=row.expires_at if row.holder else None, last_cycle_at=row.cycled_at,
                  last_cycle_age_s=age, stale_after_s=stale_after, down_since=down_since,
                  summary=summary)


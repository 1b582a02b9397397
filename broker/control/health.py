"""Is a broker acting on this database? One answer for `onepool health`, `status`, `submit`
and the API's /healthz.

The broker is UP when a leader holds an unexpired lease and finished a cycle within
`stale_after_s` (the larger of the lease period and three cycles). Otherwise it is down
since its last sign of life (the later of its last renewal and its last cycle), or it never
ran on this database.
"""

from __future__ import annotations

from pydantic import BaseModel
from sqlmodel import Session

from broker.control.lease import NAME
from broker.errors import NotConfigured
from broker.spec import BrokerSettings
from broker.state.model import Lease


class Health(BaseModel):
    broker_up: bool
    leader: str | None  # holder id (host:pid:...) of the lease, None when free
    fencing: int  # the lease's fencing number (how many times leadership changed hands)
    lease_expires_at: float | None
    last_cycle_at: float | None
    last_cycle_age_s: float | None
    stale_after_s: float
    down_since: float | None  # when not up: the last sign of life (None: never ran)
    summary: str  # one human line

    @property
    def ever_ran(self) -> bool:
        return self.last_cycle_at is not None or self.fencing > 0


def settings(s: Session) -> BrokerSettings:
    """The applied broker settings (defaults when nothing was applied yet)."""
    from broker.control.config_apply import applied_config

    try:
        return applied_config(s).broker
    except NotConfigured:
        return BrokerSettings()


def health(s: Session, now: float) -> Health:
    """The broker's health at `now` (the broker's clock). Reads only."""
    cfg = settings(s)
    stale_after = max(cfg.lease_s, 3 * cfg.cycle_s)
    row = s.get(Lease, NAME)
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


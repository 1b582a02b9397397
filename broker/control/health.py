"""Is a broker acting on this database? One answer for `onepool health`, `status`, `submit`
and the API's /healthz.

The broker is UP when a leader holds an unexpired lease and finished a cycle within
`stale_after_s` (the larger of the lease period and three cycles). Otherwise it is down
since its last sign of life (the later of its last renewal and its last cycle), or it never
ran on this database.
"""

from __future__ import annotations

from sqlmodel import Session

from broker.control.lease import NAME
from broker.errors import NotConfigured
from broker.spec import BrokerSettings
from broker.state.health_view import assess
from broker.state.model import Lease
from broker.wire import Health


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
    return assess(s.get(Lease, NAME), cfg.lease_s, cfg.cycle_s, now)

"""What every route needs: the store, the clock, the token verifier, the agents' mailbox, and
hooks into a broker loop running in the same process (if any)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request
from prometheus_client import CollectorRegistry

from broker.api.batcher import SubmitBatcher
from broker.api.mailbox import Mailbox
from broker.client.sdk import Client
from broker.clock import Clock
from broker.control.agents import Timing
from broker.control.config_apply import applied_config
from broker.errors import NotConfigured
from broker.state.store import Store
from broker.state.tokens import Principal, Verifier


@dataclass
class ApiContext:
    store: Store
    clock: Clock
    verifier: Verifier = field(default_factory=Verifier)
    mailbox: Mailbox = field(default_factory=Mailbox)
    batcher: SubmitBatcher = field(init=False)
    # Called when an agent reported something the engine should act on (a rank exited, a
    # notice): wakes a broker loop in this process. Other processes' brokers see it on
    # their next cycle.
    on_agent_report: Callable[[], None] = lambda: None
    check_s: float = 1.0  # long polls look at the database at least this often
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)  # what /metrics serves
    _timing: tuple[float, Timing] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.batcher = SubmitBatcher(self.store, self.verifier, self.client)

    def client(self, principal: Principal) -> Client:
        return Client(store=self.store, clock=self.clock, principal=principal)

    def timing(self) -> Timing:
        """The agents' heartbeat and lost-after times from the applied config (re-read every
        few seconds; defaults while nothing is configured)."""
        with self._lock:
            cached = self._timing
            if cached is not None and time.monotonic() - cached[0] < 5.0:
                return cached[1]
        try:
            with self.store.session() as s:
                b = applied_config(s).broker
            t = Timing(b.agent_heartbeat_s, b.node_lost_after_s)
        except NotConfigured:
            t = Timing()
        with self._lock:
            self._timing = (time.monotonic(), t)
        return t


def ctx(request: Request) -> ApiContext:
    return request.app.state.ctx


def bearer(request: Request) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, or None."""
    h = request.headers.get("authorization", "")
    scheme, _, value = h.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def principal(request: Request) -> Principal:
    """The member or admin behind the request's token. Raises Unauthorized."""
    return verify(ctx(request), bearer(request))


def verify(c: ApiContext, token: str | None) -> Principal:
    """The member or admin behind `token`, checked against its stored hash (the slow hash
    runs once per token and process). Raises Unauthorized."""
    with c.store.session() as s:
        return c.verifier.api_principal(s, token)


def client(request: Request) -> Client:
    """An SDK client acting as the request's principal. Raises Unauthorized."""
    return ctx(request).client(principal(request))

"""What every route needs: the store, the clock, the token verifier, the agents' mailbox, the
server's limits (broker.spec_broker.ApiSettings) and the agent routes' own threads, and hooks
into a broker loop running in the same process (if any)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import Request
from prometheus_client import CollectorRegistry

from broker.api.batcher import SubmitBatcher
from broker.api.guard import authenticated
from broker.api.mailbox import Mailbox
from broker.client.sdk import Client
from broker.clock import Clock
from broker.control.agents import Timing
from broker.control.config_apply import applied_config
from broker.errors import NotConfigured
from broker.output_log import DEFAULT_CAP
from broker.spec_broker import ApiSettings
from broker.state.store import Store
from broker.state.tokens import Principal, Verifier

log = logging.getLogger("onepool.api")
T = TypeVar("T")
SETTINGS_TTL_S = 5.0  # the applied config's broker settings are re-read this often


@dataclass
class ApiContext:
    store: Store
    clock: Clock
    mailbox: Mailbox = field(default_factory=Mailbox)
    verifier: Verifier = field(init=False)
    batcher: SubmitBatcher = field(init=False)
    # The agent routes' threads: user routes run on the server's shared pool, so a flood there
    # never makes an agent's heartbeat wait for a thread (sized by broker.api.agent_threads).
    agent_limiter: CapacityLimiter = field(init=False)
    # Called when an agent reported something the engine should act on (a rank exited, a
    # notice): wakes a broker loop in this process. Other processes' brokers see it on
    # their next cycle.
    on_agent_report: Callable[[], None] = lambda: None
    check_s: float = 1.0  # long polls look at the database at least this often
    _settings: tuple[float, Timing, ApiSettings, int] | None = None
    _refreshing: bool = False
    refreshed: asyncio.Future[None] | None = None
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)  # what /metrics serves
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.verifier = Verifier(self.clock)
        self.batcher = SubmitBatcher(self.store, self.verifier, self.client)
        self.agent_limiter = CapacityLimiter(self._read()[2].agent_threads)

    def client(self, principal: Principal) -> Client:
        return Client(store=self.store, clock=self.clock, principal=principal)

    def _read(self) -> tuple[float, Timing, ApiSettings, int]:
        """The applied config's agent timing, API limits and output cap, read at most every SETTINGS_TTL_S
        (defaults while nothing is configured, then read at every call). May read the
        database: not on the event loop."""
        with self._lock:
            cached = self._settings
            if cached is not None and time.monotonic() - cached[0] < SETTINGS_TTL_S:
                return cached
        try:
            with self.store.session() as s:
                b = applied_config(s).broker
            got = (time.monotonic(), Timing(b.agent_heartbeat_s, b.node_lost_after_s), b.api,
                   b.output_cap_bytes)
        except NotConfigured:  # defaults, read again next time (a config may come any moment)
            got = (-SETTINGS_TTL_S, Timing(), ApiSettings(), DEFAULT_CAP)
        with self._lock:
            self._settings = got
        return got

    def timing(self) -> Timing:
        """The agents' heartbeat and lost-after times from the applied config (re-read every
        few seconds; defaults while nothing is configured)."""
        return self._read()[1]

    def forget_settings(self) -> None:
        """Read the applied config again at the next call (a config was just applied here)."""
        with self._lock:
            self._settings = (-SETTINGS_TTL_S, *self._settings[1:]) if self._settings else None

    def output_cap(self) -> int:
        """broker.output_cap_bytes of the applied config (re-read every few seconds)."""
        return self._read()[3]

    def limits(self) -> ApiSettings:
        """The API limits last read, for the event loop: never reads the database itself; when
        they are older than SETTINGS_TTL_S, one read starts in a worker thread (`refreshed`
        is its future) and later requests see its result."""
        with self._lock:
            cached = self._settings
        assert cached is not None, "read once at construction"
        if time.monotonic() - cached[0] >= SETTINGS_TTL_S and not self._refreshing:
            self._refreshing = True
            self.refreshed = asyncio.get_running_loop().run_in_executor(None, self._refresh)
        api = cached[2]
        if self.agent_limiter.total_tokens != api.agent_threads:
            self.agent_limiter.total_tokens = api.agent_threads
        return api

    def _refresh(self) -> None:
        """limits()'s read, in a worker thread."""
        try:
            self._read()
        except Exception as e:  # noqa: BLE001  (the old limits stay; the next request retries)
            log.warning("could not re-read the API limits from the applied config: %s", e)
        finally:
            self._refreshing = False

    async def agent_work(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` (database work of an agent route) on the agent routes' threads."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.agent_limiter)


def ctx(request: Request) -> ApiContext:
    return request.app.state.ctx


def bearer(request: Request) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, or None."""
    h = request.headers.get("authorization", "")
    scheme, _, value = h.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def principal(request: Request) -> Principal:
    """The member or admin behind the request's token (the request is marked authenticated
    for the guard). Raises Unauthorized."""
    p = verify(ctx(request), bearer(request))
    authenticated(request.scope)
    return p


def verify(c: ApiContext, token: str | None) -> Principal:
    """The member or admin behind `token`, checked against its stored hash (the slow hash
    runs once per token and process). Raises Unauthorized."""
    with c.store.session() as s:
        return c.verifier.api_principal(s, token)


def client(request: Request) -> Client:
    """An SDK client acting as the request's principal. Raises Unauthorized."""
    return ctx(request).client(principal(request))

"""Build the FastAPI app: `create_app(store, clock)`. `onepool server` serves it with uvicorn
next to the broker loop; tests serve it on 127.0.0.1 or call it in-process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from broker import __version__
from broker.api import (
    errors,
    routes_admin,
    routes_agent,
    routes_code,
    routes_estimate,
    routes_jobs,
    routes_metrics,
    routes_people,
    routes_replay,
)
from broker.api.context import ApiContext
from broker.api.guard import Guard
from broker.api.mailbox import Mailbox
from broker.api.routes_dashboard import router as dashboard_router
from broker.clock import Clock
from broker.observe.metrics import registry_for
from broker.state.store import Store
from broker.state.wake import AGENTS_CHANNEL, POLL_S, WakeWatch


def create_app(store: Store, clock: Clock, *, mailbox: Mailbox | None = None,
               on_agent_report: Callable[[], None] | None = None,
               check_s: float = 1.0, agent_wakes: bool = False) -> FastAPI:
    """The API over `store`. `mailbox` and `on_agent_report` connect it to a broker loop in
    the same process (agents' polls wake on the engine's writes, the engine on agents'
    reports); without them each side polls the database. `agent_wakes` (an API without a
    broker of its own): a thread watches the leader's wake-ups for agents in another process
    (broker.state.wake) and wakes the waiting polls at once. `GET /metrics` serves Prometheus
    metrics of `store` and of this process (broker.api.routes_metrics)."""
    context = ApiContext(store=store, clock=clock, mailbox=mailbox or Mailbox(), check_s=check_s)
    if on_agent_report is not None:
        context.on_agent_report = on_agent_report

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        context.mailbox.bind(asyncio.get_running_loop())
        stop = threading.Event()
        watcher = None
        if agent_wakes:
            watcher = threading.Thread(target=_relay_agent_wakes, args=(store, context.mailbox, stop),
                                       daemon=True, name="agent-wakes")
            watcher.start()
        yield
        stop.set()
        if watcher is not None:
            watcher.join(timeout=5)

    app = FastAPI(title="onepool", version=__version__, lifespan=lifespan,
                  description="One priority queue over every GPU a group can reach. "
                              "Send `Authorization: Bearer TOKEN` (from `onepool token create`).")
    context.metrics = registry_for(store, clock)
    app.state.ctx = context
    errors.install(app)
    for r in (routes_jobs.router, routes_admin.router, routes_agent.router, routes_metrics.router,
              routes_estimate.router, routes_people.router, routes_replay.router, routes_code.router):
        app.include_router(r)
    app.include_router(dashboard_router)  # what the dashboard reads (dashboard.remote)
    app.add_middleware(routes_metrics.TimedRoutes)
    app.add_middleware(Guard, limits=context.limits, clock=clock)  # outermost: before any work
    return app


def _relay_agent_wakes(store: Store, mailbox: Mailbox, stop: threading.Event) -> None:
    """Until `stop`: every POLL_S, if the leader (another process) wrote something for an
    agent, wake every waiting agent poll."""
    watch = WakeWatch(store.agents_wake, store.engine, AGENTS_CHANNEL)
    try:
        while not stop.wait(POLL_S):
            if watch.poked():
                mailbox.notify_all()
    finally:
        watch.close()

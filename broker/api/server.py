"""`onepool server`: the HTTP API and the broker loop in one process.

The loop runs in a thread beside uvicorn; they share the database and two wake-ups: the
engine's writes for a node wake that node's agent poll (the mailbox), and agents' reports
wake the engine. `--no-broker` serves the API only (more API processes may run against the
same database; exactly one process should run the broker loop).
"""

from __future__ import annotations

import logging
import threading

import uvicorn

from broker.api.app import create_app
from broker.api.mailbox import Mailbox
from broker.clock import SystemClock
from broker.control.service import BrokerLoop
from broker.state.store import Store

log = logging.getLogger("onepool.server")


def serve(store: Store, host: str, port: int, *, broker: bool = True,
          cycle_s: float | None = None) -> None:
    """Serve until SIGTERM/SIGINT; the broker loop (if any) stops after its current cycle."""
    clock = SystemClock()
    mailbox = Mailbox()
    loop = BrokerLoop(store, clock, cycle_s=cycle_s, notify=mailbox.notify) if broker else None
    app = create_app(store, clock, mailbox=mailbox,
                     on_agent_report=loop.executors.changed if loop else None)
    thread = None
    if loop is not None:
        thread = threading.Thread(target=loop.run, name="broker-loop", daemon=True)
        thread.start()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    log.info("onepool server on http://%s:%d (broker loop: %s)", host, port, "on" if loop else "off")
    try:
        server.run()
    finally:
        if loop is not None and thread is not None:
            loop.request_stop()
            thread.join(timeout=30)

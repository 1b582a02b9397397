"""`onepool server`: the HTTP API and the broker loop in one process.

The loop (broker.control.service.run: stand by for the lease, then cycle) runs in a thread
beside uvicorn; they share the database and two wake-ups: the engine's writes for a node
wake that node's agent poll (the mailbox), and agents' reports wake the engine. `--no-broker`
serves the API only (more API processes may run against the same database; one broker
leads at a time, others stand by); its agents' polls wake on the leader's wake-ups for agents
(broker.state.wake) instead.

The process switches threads every 1 ms (Python's default is 5 ms): the submit batcher and
the broker loop give up the GIL at every SQLite call, and a thread that wants it back should
not wait 5 ms behind the event loop each time (measured: bench/api_submit.py).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import uvicorn

from broker.api.app import create_app
from broker.api.http_protocol import HeadDeadlineProtocol
from broker.api.mailbox import Mailbox
from broker.clock import SystemClock
from broker.control import service
from broker.state.store import Store

log = logging.getLogger("onepool.server")
SWITCH_INTERVAL_S = 0.001
FORWARDED_ALLOW_IPS = "FORWARDED_ALLOW_IPS"  # uvicorn's own setting, here opt-in (see uvicorn_config)


def uvicorn_config(app: object, host: str, port: int) -> uvicorn.Config:
    """How `serve` runs uvicorn: h11 with a deadline for each request's head
    (broker.api.http_protocol), so idle connections cannot use up the server's descriptors.
    X-Forwarded-For is honoured only from the addresses the operator lists in
    FORWARDED_ALLOW_IPS (a proxy's): by default from none, since jobs of local pools reach
    the server from 127.0.0.1 too and would pick any address for the per-address 429 limit
    (escaping it, or pinning it on someone else's address)."""
    trusted = os.environ.get(FORWARDED_ALLOW_IPS, "").strip()
    return uvicorn.Config(app, host=host, port=port, log_level="warning",  # type: ignore[arg-type]
                          timeout_graceful_shutdown=5, http=HeadDeadlineProtocol,
                          proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None)


def serve(store: Store, host: str, port: int, *, broker: bool = True,
          cycle_s: float | None = None) -> None:
    """Serve until SIGTERM/SIGINT; the broker loop (if any) stops after its current cycle and
    gives its lease back."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    clock = SystemClock()
    mailbox = Mailbox()
    wake, stop = threading.Event(), threading.Event()
    app = create_app(store, clock, mailbox=mailbox, on_agent_report=wake.set if broker else None,
                     agent_wakes=not broker)
    thread = None
    if broker:
        thread = threading.Thread(target=service.run, name="broker-loop", daemon=True,
                                  args=(store, clock),
                                  kwargs={"cycle_s": cycle_s, "stop": stop, "wake": wake,
                                          "notify": mailbox.notify})
        thread.start()
    server = uvicorn.Server(uvicorn_config(app, host, port))
    log.info("onepool server on http://%s:%d (broker loop: %s)", host, port, "on" if broker else "off")
    try:
        server.run()
    finally:
        if thread is not None:
            stop.set()
            wake.set()
            thread.join(timeout=30)

"""Builders for tests with a real API server, real agent processes and, optionally, network
namespaces standing for other hosts (../shared/notes/multi-host-netns.md)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from broker.api.app import create_app
from broker.api.mailbox import Mailbox
from broker.client.sdk import Client
from broker.clock import Clock
from broker.control.engine import Engine
from broker.control.executors import Executors
from broker.spec import parse_config
from broker.state.store import Store
from providers.local import LocalProcesses
from tests.conftest import HOST_SETTINGS, config


@dataclass
class ApiServer:
    """uvicorn serving the API in a thread of the test process."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str
    app: Any = None

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def restart(self, app: Any) -> ApiServer:
        """`app` (a fresh one: an app is bound to its server's event loop) served at this
        server's address: a server started again after an outage."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return serve(app, host, int(port))


def serve(app: Any, host: str = "127.0.0.1", port: int = 0) -> ApiServer:
    """Serve `app` at host:port (port 0: any free one) until stop()."""
    srv = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                        timeout_graceful_shutdown=1))
    t = threading.Thread(target=srv.run, daemon=True, name="api-server")
    t.start()
    deadline = time.monotonic() + 15
    while not srv.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    port = srv.servers[0].sockets[0].getsockname()[1]
    return ApiServer(srv, t, f"http://{host}:{port}", app)


@dataclass
class Site:
    """A broker home with its API server and an engine driven by the test (injected clock)."""

    client: Client
    engine: Engine
    api: ApiServer
    home: Path
    new_app: Callable[[], Any] | None = None  # another API process on this database

    @property
    def url(self) -> str:
        return self.api.url

    def restart_api(self) -> None:
        """Start the API again at its address (after `api.stop()`), as a new process would."""
        assert self.new_app is not None
        self.api = self.api.restart(self.new_app())

    def standby_api(self, host: str = "127.0.0.1") -> ApiServer:
        """A second API process on this database (a standby's), at its own address."""
        assert self.new_app is not None
        return serve(self.new_app(), host)

    def close(self) -> None:
        """Stop the engine's cloud workers, then the API."""
        self.engine.close()
        self.api.stop()


def make_site(home: Path, clock: Clock, host: str = "127.0.0.1", **cfg: Any) -> Site:
    """A site whose config (tests.conftest.config kwargs) gets broker.server_url = the API's."""
    store = Store(home)
    mailboxes: list[Mailbox] = []
    holder: dict[str, Executors] = {}

    def new_app() -> Any:
        mailboxes.append(Mailbox())
        return create_app(store, clock, mailbox=mailboxes[-1], check_s=0.2,
                          on_agent_report=lambda: holder["x"].changed() if "x" in holder else None)

    def notify(node: str) -> None:
        for m in mailboxes:
            m.notify(node)

    api = serve(new_app(), host)
    c = Client(store=store, clock=clock)
    data = config(**{"node_lost_after_s": 3600, **cfg})  # tests advancing the clock lose no agent
    data["broker"]["server_url"] = api.url
    c.apply(parse_config(data))
    holder["x"] = ex = Executors(store, clock, home / "runs", notify=notify)
    return Site(c, Engine(store, clock, ex), api, home, new_app)


@dataclass
class AgentProc:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        self.proc.wait(timeout=15)

    def ranks(self) -> LocalProcesses:
        return LocalProcesses(self.state_dir / "runs")


def spawn_agent(url: str, state_dir: Path, *, join_token: str | None = None, gpus: int = 2,
                gpu_type: str = "A100", prefix: list[str] | None = None,
                metadata: str = "none", metadata_url: str | None = None,
                args: Sequence[str] = (), extra: list[str] | None = None,
                env: dict[str, str] | None = None) -> AgentProc:
    """`onepool agent` as a separate process (in a namespace when `prefix` says so), with
    `args` and `extra` appended to its command line; `env`: variables it gets besides this
    process's (it inherits none of this one's ONEPOOL_* but the host settings)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir.parent / f"{state_dir.name}.log"
    argv = [sys.executable, "-m", "broker.client.cli", "agent", "--server", url, "--state-dir",
            str(state_dir), "--gpus", str(gpus), "--gpu-type", gpu_type, "--metadata", metadata]
    if join_token:
        argv += ["--join-token", join_token]
    if metadata_url:
        argv += ["--metadata-url", metadata_url]
    argv += [*args, *(extra or [])]
    environ = {**{k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_") or k in HOST_SETTINGS},
               **(env or {})}
    with open(log, "ab") as f:
        p = subprocess.Popen([*(prefix or []), *argv], env=environ, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    return AgentProc(p, state_dir, log)


@contextmanager
def agents_cleanup() -> Iterator[list[AgentProc]]:
    """Every agent appended to the yielded list is killed, with its ranks, at the end."""
    spawned: list[AgentProc] = []
    try:
        yield spawned
    finally:
        for a in spawned:
            a.kill()
            a.ranks().kill_all()


@dataclass
class Netns:
    """A network namespace with a veth link to this host: `host_ip` (here), `ip` (inside)."""

    name: str
    host_ip: str
    ip: str
    link: str

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]


@contextmanager
def netns() -> Iterator[Netns]:
    """One namespace per call (unique names; removed at the end, also on failure). Skips the
    test when namespaces cannot be made here (not root, no CAP_NET_ADMIN)."""
    suffix = secrets.token_hex(3)
    name, link, peer = f"opt{suffix}", f"opb{suffix}", f"oph{suffix}"
    net = 10 + int(suffix[:2], 16) % 200
    host_ip, ip = f"10.231.{net}.1", f"10.231.{net}.2"
    steps = [["ip", "netns", "add", name],
             ["ip", "link", "add", link, "type", "veth", "peer", "name", peer],
             ["ip", "link", "set", peer, "netns", name],
             ["ip", "addr", "add", f"{host_ip}/24", "dev", link], ["ip", "link", "set", link, "up"],
             ["ip", "netns", "exec", name, "ip", "addr", "add", f"{ip}/24", "dev", peer],
             ["ip", "netns", "exec", name, "ip", "link", "set", peer, "up"],
             ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
             # to reach a server bound on another namespace's host address (all are this host's)
             ["ip", "netns", "exec", name, "ip", "route", "add", "default", "via", host_ip]]
    try:
        for s in steps:
            r = subprocess.run(s, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"network namespaces are not available here ({' '.join(s)}: "
                            f"{r.stderr.strip()}); the same tests run with agents on 127.0.0.1")
        yield Netns(name, host_ip, ip, link)
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


class FakeImds:
    """AWS's instance metadata service (IMDSv2) on 127.0.0.1: a session token from PUT
    /latest/api/token, then spot/instance-action answers 404 until `arm()`."""

    def __init__(self) -> None:
        self.action: dict[str, str] | None = None
        self.tokens_asked = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_PUT(self) -> None:
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if self.path == "/latest/api/token" and ttl:
                    outer.tokens_asked += 1
                    self._send(200, "tok-123")
                else:
                    self._send(400, "bad request")

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                    self._send(401, "")
                elif self.path == "/latest/meta-data/spot/instance-action" and outer.action:
                    self._send(200, json.dumps(outer.action))
                else:
                    self._send(404, "Not Found")

            def _send(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def arm(self, when: str = "2026-12-03T10:02:00Z") -> None:
        self.action = {"action": "terminate", "time": when}

    def close(self) -> None:
        self.httpd.shutdown()


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 30.0, step: float = 0.05) -> Any:
    """Poll `cond` (something with no event to await: another process's state) until truthy."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached in {timeout:g}s")
        time.sleep(step)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


__all__ = ["AgentProc", "ApiServer", "FakeImds", "Netns", "Site", "agents_cleanup", "alive",
           "make_site", "netns", "serve", "spawn_agent", "wait_for"]

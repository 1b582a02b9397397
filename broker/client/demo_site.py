"""The demo's lab: `onepool server` and the on-prem agents as separate processes, and the
simulated instances of the spot pool (broker.client.demo_instances), started and stopped together.

Everything the processes need comes from the home: the config (with `broker.server_url`
pointing at the server), admin and team tokens, one join token per on-prem host.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from sqlmodel import col, select

from broker.client.demo_instances import Ec2Instances, InstanceBooter
from broker.client.http import HttpClient
from broker.client.sdk import Client
from broker.control.capacity_manager import broker_id
from broker.errors import OnepoolError
from broker.spec import ClusterConfig
from broker.state.model import Node, Pool
from broker.state.model_access import NodeAgent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DemoSite:
    home: Path
    config: ClusterConfig
    port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    booter: InstanceBooter | None = None
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, team: str) -> HttpClient:
        """The API client of a researcher of `team` (or "admin")."""
        return HttpClient(self.url, self.tokens[team])

    def __enter__(self) -> DemoSite:
        local = Client(self.home)
        local.apply(self.config)
        self.tokens["admin"] = local.create_token("prod", "admin", "demo admin").token or ""
        for t in self.config.teams:
            self.tokens[t.name] = local.create_token(t.name, "member", "demo").token or ""
        joins = {n.id: local.join_token(n.id).join_token for n in local.nodes()
                 if n.executor == "agent"}
        with local.store.session() as s:
            bid = broker_id(s)
        self._spawn("server", ["server", "--port", str(self.port)], self.home / "server.log")
        self._wait_healthy()
        for node, token in joins.items():
            pool = next(p for p in self.config.pools if node.startswith(p.name + "-"))
            self._spawn(node, ["agent", "--server", self.url, "--join-token", token, "--gpus",
                               str(pool.gpus_per_node), "--gpu-type", pool.gpu_type, "--state-dir",
                               str(self.home / "hosts" / node)], self.home / "hosts" / f"{node}.log")
        import boto3  # the simulated EC2: AWS_ENDPOINT_URL_EC2 points at it

        ec2 = boto3.client("ec2", region_name="us-east-1")
        source = Ec2Instances(lambda: ec2, broker_id=bid)
        self.booter = InstanceBooter(source, self.home / "instances").__enter__()
        return self

    def _spawn(self, name: str, args: list[str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "broker.client.cli", "--home", str(self.home), *args],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/healthz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise OnepoolError(f"the demo server did not answer in {timeout:g}s; see server.log in {self.home}")

    def check(self) -> None:
        """Raises OnepoolError if the server or an agent died."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                log = "server.log" if name == "server" else f"hosts/{name}.log"
                raise OnepoolError(f"the demo's {name} exited with status {p.returncode}; see {log} "
                                   f"in {self.home}")

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        for name in [n for n in self.procs if n != "server"] + ["server"]:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.booter is not None:
            self.booter.__exit__(None, None, None)
        from providers.local import LocalProcesses

        for runs in self.home.glob("hosts/*/runs"):  # the hosts' ranks end with the demo
            LocalProcesses(runs).kill_all()

    def agents(self) -> list[dict[str, Any]]:
        """Every agent that joined: node, pool, market, pid, booted_from_user_data."""
        with Client(self.home).store.session() as s:
            rows = s.exec(select(NodeAgent, Node, Pool).join(Node, col(Node.id) == NodeAgent.node)
                          .join(Pool, col(Pool.name) == Node.pool)
                          .where(col(NodeAgent.joined_at).is_not(None))).all()
        return [{"node": n.id, "pool": n.pool, "market": p.market, "pid": a.info.get("pid"),
                 "booted_from_user_data": bool(a.info.get("booted_from_user_data"))}
                for a, n, p in rows]

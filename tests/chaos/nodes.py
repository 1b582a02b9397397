"""The chaos suite's agent nodes: the on-prem hosts of the `provider: agent` pool, whose
`onepool agent` processes the driver starts (and kills, and starts again), and the moto
instances of the rented pools, booted from their user data by an InstanceBooter.

An on-prem agent that is killed comes back after a random delay, as systemd would restart
it (infra/systemd/onepool-agent.service, Restart=always) or an operator would: soon (the
agent adopts the ranks still running in its state folder) or after the broker has declared
its node lost (the ranks fenced themselves; the node rejoins empty). A rented instance's
agent is not restarted: the instance's user data ran once, so its node goes lost and the
broker terminates the instance.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.agents.harness import AgentProc, spawn_agent


@dataclass
class Host:
    """One on-prem node and the agent serving it (None while it is down)."""

    node: str
    gpus: int
    gpu_type: str
    state_dir: Path
    agent: AgentProc | None = None
    back_at: float | None = None  # when the killed agent starts again (monotonic)


@dataclass
class Hosts:
    """The on-prem agents of the chaos site; `client` makes join tokens (admin, embedded)."""

    client: Any
    server_url: str
    home: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    restarts: int = 0

    def add(self, node: str, gpus: int, gpu_type: str) -> None:
        self.hosts[node] = Host(node, gpus, gpu_type, self.home / "hosts" / node)

    def start(self, h: Host) -> None:
        """Start h's agent: with its credential if it joined before, else a fresh join token."""
        joined = (h.state_dir / "agent.json").exists()
        token = None if joined else self.client.join_token(h.node).join_token
        h.agent = spawn_agent(self.server_url, h.state_dir, join_token=token, gpus=h.gpus,
                              gpu_type=h.gpu_type)
        h.back_at = None

    def start_all(self) -> None:
        for h in self.hosts.values():
            if h.agent is None or h.agent.proc.poll() is not None:
                self.start(h)

    def live(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.agent is not None and h.agent.proc.poll() is None]

    def kill(self, h: Host, back_in_s: float) -> None:
        """SIGKILL h's agent (its ranks keep running); it starts again `back_in_s` from now."""
        assert h.agent is not None
        h.agent.kill(signal.SIGKILL)
        h.agent, h.back_at = None, time.monotonic() + back_in_s

    def tend(self) -> None:
        """Start the agents whose time has come; an agent that died by itself is an error
        the suite reports (see `died`)."""
        now = time.monotonic()
        for h in self.hosts.values():
            if h.agent is None and h.back_at is not None and now >= h.back_at:
                self.start(h)
                self.restarts += 1

    def died(self) -> list[str]:
        """Agents that exited without being killed by the suite: node and log tail."""
        out = []
        for h in self.hosts.values():
            if h.agent is not None and h.agent.proc.poll() is not None:
                tail = h.agent.log.read_text(errors="replace")[-1500:]
                out.append(f"agent of {h.node} exited {h.agent.proc.returncode}: {tail}")
                h.agent, h.back_at = None, time.monotonic()
        return out

    def stop_all(self) -> None:
        for h in self.hosts.values():
            if h.agent is not None and h.agent.proc.poll() is None:
                h.agent.kill(signal.SIGTERM)
            h.agent = None

    def runs(self) -> list[Path]:
        return [h.state_dir / "runs" for h in self.hosts.values()]


def rented_agents(booter: Any) -> list[str]:
    """Instance ids whose agent (the user data's process) is alive now."""
    return [iid for iid, b in list(booter.booted.items()) if b.proc.poll() is None]


def processes_under(home: Path, *markers: str) -> list[psutil.Process]:
    """Live processes whose command line names `home` and one of `markers`."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.info.get("cmdline") or [])
            if str(home) in cmd and any(m in cmd for m in markers) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out

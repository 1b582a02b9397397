"""The agent's loop. One process per node; everything it knows survives a restart in its state
folder (0700): `agent.json` (its node and credential, 0600), `lease` (touched after every
successful sync) and `runs/` (one folder per rank, as providers.local writes them, plus the
rank's assignment).

Threads: the poller long-polls /v1/agent/sync (each call a heartbeat); a reporter makes an
immediate short sync when a rank exits; a shipper sends new output every second; a watcher
reads the cloud's metadata service for interruption notices; a sampler reads each GPU's
utilization (broker.agent.gpu_util: NVML where it loads) and each report carries the mean of
every rank's GPUs since the previous one. A restarted agent adopts the
ranks still running in `runs/` (nothing is started twice: starts are idempotent per rank
folder), and reports those the broker has given up on, which it then kills.

Fencing: every rank's supervisor stops the rank when the lease file is older than the
fence time the server gave (two thirds of the time after which the broker declares the node
lost), so a node cut off from the server stops its work before the broker places it again.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broker import __version__
from broker.agent.gpu_util import SAMPLE_S, Reader, default_reader, gpus_of
from broker.agent.hardware import Gpus
from broker.agent.metadata import Watcher
from broker.observe.logs import context
from providers.base import Handle, RankState
from providers.local import LocalProcesses
from providers.local_runner import write_json

log = logging.getLogger("onepool.agent")
LOG_PIECE = 512 * 1024


class AgentError(Exception):
    """The agent cannot go on (bad or used join token, credential revoked, node retired)."""


@dataclass
class Rank:
    assignment_id: int
    attempt_id: int
    rank: int
    handle: Handle
    shipped: int = 0
    acked: int = 0
    gpus: tuple[int, ...] = ()  # its GPU indices (CUDA_VISIBLE_DEVICES)
    util_sum: float = 0.0  # utilization samples since the last report (broker.agent.gpu_util)
    util_n: int = 0


@dataclass
class Agent:
    """A node agent. `http` is the client to the server (base_url set); tests may pass one."""

    server: str
    state_dir: Path
    gpus: Gpus
    join_token: str | None = None
    watcher: Watcher | None = None
    http: httpx.Client | None = None
    poll_timeout_s: float = 60.0
    stop: threading.Event = field(default_factory=threading.Event)
    util: Reader | None = None  # GPU utilization (None: not reported)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state_dir, 0o700)
        self.http = self.http or httpx.Client(base_url=self.server.rstrip("/"),
                                              timeout=self.poll_timeout_s + 30)
        self.changed = threading.Event()
        self.procs = LocalProcesses(self.state_dir / "runs", on_change=self.changed.set)
        self.ranks: dict[int, Rank] = {}
        self.lock = threading.RLock()
        self.node = ""
        self.credential = ""
        self.heartbeat_s, self.fence_s = 5.0, 20.0
        self.reported_notices: set[str] = set()
        self.error: AgentError | None = None
        self.syncs = {"ok": 0, "error": 0}  # onepool_agent_syncs_total (broker.observe.agent_metrics)

    # -- identity -----------------------------------------------------------------------------
    @property
    def lease(self) -> Path:
        return self.state_dir / "lease"

    def _info(self) -> dict[str, Any]:
        return {"hostname": socket.gethostname(), "pid": os.getpid(), "gpus": self.gpus.count,
                "gpu_type": self.gpus.gpu_type, "gpu_names": ",".join(self.gpus.names),
                "gpu_source": self.gpus.source, "version": __version__,
                "booted_from_user_data": os.environ.get("ONEPOOL_BOOTED_FROM_USER_DATA") == "1",
                "metadata": type(self.watcher).__name__ if self.watcher else "none"}

    def join(self) -> None:
        """Use the saved credential, else redeem the join token. Raises AgentError."""
        saved = self.state_dir / "agent.json"
        if saved.exists():
            data = json.loads(saved.read_text())
            if data.get("server") == self.server:
                self.node, self.credential = data["node"], data["credential"]
                self.heartbeat_s, self.fence_s = data.get("heartbeat_s", 5.0), data.get("fence_s", 20.0)
                log.info("agent: node %s (saved credential)", self.node)
                return
        if not self.join_token:
            raise AgentError(f"no saved credential in {saved} and no --join-token: ask an admin "
                             "for one (`onepool node join-token NODE`)")
        r = self._post("/v1/agent/join", {"join_token": self.join_token, "info": self._info()},
                       auth=False)
        reply = r.json()
        self.node, self.credential = reply["node"], reply["credential"]
        self.heartbeat_s, self.fence_s = reply["heartbeat_s"], reply["fence_s"]
        tmp = saved.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"server": self.server, "node": self.node, "credential": self.credential,
                       "heartbeat_s": self.heartbeat_s, "fence_s": self.fence_s}, f)
        tmp.replace(saved)
        self.lease.touch()
        log.info("agent: joined as node %s of pool %s", self.node, reply["pool"])

    def _post(self, path: str, body: dict[str, Any], *, auth: bool = True,
              timeout: float | None = None) -> httpx.Response:
        assert self.http is not None
        headers = {"Authorization": f"Bearer {self.credential}"} if auth else {}
        r = self.http.post(path, json=body, headers=headers,
                           timeout=timeout if timeout is not None else self.http.timeout)
        if r.status_code == 401:
            raise AgentError(f"the server refused this agent: {_message(r)}")
        if r.status_code >= 400:
            raise httpx.HTTPStatusError(f"{r.status_code}: {_message(r)}", request=r.request, response=r)
        return r

    # -- ranks --------------------------------------------------------------------------------
    def adopt(self) -> None:
        """Take back the ranks a previous run of this agent started (still running or not yet
        reported), from their folders."""
        for f in sorted((self.state_dir / "runs").glob("attempt-*/rank-*/assignment.json")):
            a = json.loads(f.read_text())
            h = self.procs.adopt(a["attempt_id"], a["rank"])
            if h is None:
                continue
            self.ranks[a["assignment_id"]] = Rank(a["assignment_id"], a["attempt_id"], a["rank"], h,
                                                  shipped=a.get("shipped", 0),
                                                  gpus=tuple(a.get("gpus", ())))
            log.info("agent: adopted rank %s of attempt %s", a["rank"], a["attempt_id"],
                     extra=context(attempt=a["attempt_id"], node=self.node))

    def _start(self, a: dict[str, Any]) -> None:
        env = {**a["env"], "ONEPOOL_AGENT_LEASE": str(self.lease),
               "ONEPOOL_AGENT_FENCE_S": f"{self.fence_s:g}", "ONEPOOL_NODE_ID": self.node}
        d = self.procs.run_dir(a["attempt_id"], a["rank"])
        d.mkdir(parents=True, exist_ok=True)
        keep = {**{k: a[k] for k in ("assignment_id", "attempt_id", "rank")}, "gpus": gpus_of(a["env"])}
        (d / "assignment.json").write_text(json.dumps(keep))
        try:
            h = self.procs.start(a["attempt_id"], a["rank"], list(a["argv"]), env, recover=True)
        except OSError as e:  # e.g. its working directory does not exist on this host
            with open(d / "output.log", "a") as f:
                f.write(f"onepool agent: cannot start the rank on node {self.node}: {e}\n")
            write_json(d / "exit.json", {"code": 127})
            h = {"rank": a["rank"], "pid": -1, "create_time": 0.0, "run_dir": str(d)}
        self.ranks[a["assignment_id"]] = Rank(a["assignment_id"], a["attempt_id"], a["rank"], h,
                                              gpus=tuple(keep["gpus"]))
        log.info("agent: rank %s of attempt %s started (pid %s)", a["rank"], a["attempt_id"], h["pid"],
                 extra=context(attempt=a["attempt_id"], node=self.node))

    def _reports(self) -> list[dict[str, Any]]:
        out = []
        for r in self.ranks.values():
            st = self.procs.status(r.handle)
            if st.state == RankState.ORPHANED:  # its supervisor died; what it left dies first
                self.procs.kill(r.handle)
                log.warning("agent: the supervisor of rank %s of attempt %s died; its processes "
                            "were killed", r.rank, r.attempt_id)
                st = self.procs.status(r.handle)
            # ORPHANED still: reported running, so the broker starts no other attempt while a
            # process of this one lives (it is killed again at the next report)
            state = {RankState.RUNNING: "running", RankState.ORPHANED: "running",
                     RankState.EXITED: "exited"}.get(st.state, "lost")
            if st.cause == "fenced":  # it stopped itself, cut off from the server: not the job's
                state = "lost"        # failure; the broker requeues it

            out.append({"assignment_id": r.assignment_id, "state": state,
                        "pid": r.handle.get("pid"), "exit_code": st.exit_code,
                        "gpu_util_pct": round(r.util_sum / r.util_n, 2) if r.util_n else None})
            r.util_sum, r.util_n = 0.0, 0
        return out

    def sample_utilization(self) -> None:
        """One utilization sample of every GPU, added to the rank holding it. Raises OSError or
        ValueError when the reader cannot read now."""
        assert self.util is not None
        per_gpu = self.util.read()
        with self.lock:
            for r in self.ranks.values():
                vals = [per_gpu[g] for g in r.gpus if g in per_gpu]
                if vals:
                    r.util_sum += sum(vals) / len(vals)
                    r.util_n += 1

    # -- the protocol ---------------------------------------------------------------------------
    def sync(self, wait_s: float) -> None:
        """One sync: report, then act on the answer. Raises AgentError, httpx errors."""
        with self.lock:
            body = {"ranks": self._reports(), "known": list(self.ranks),
                    "acked": {str(k): r.acked for k, r in self.ranks.items() if r.acked},
                    "wait_s": wait_s}
        try:
            r = self._post("/v1/agent/sync", body, timeout=wait_s + 30)
        except (AgentError, httpx.HTTPError, OSError):
            self.syncs["error"] += 1
            raise
        self.syncs["ok"] += 1
        os.utime(self.lease) if self.lease.exists() else self.lease.touch()
        self._apply(r.json())

    def _apply(self, reply: dict[str, Any]) -> None:
        with self.lock:
            self.heartbeat_s, self.fence_s = reply["heartbeat_s"], reply["fence_s"]
            for a in reply["assignments"]:
                if a["assignment_id"] not in self.ranks:
                    self._start(a)
            for sig in reply["signals"]:
                rk = self.ranks.get(sig["assignment_id"])
                if rk is not None and sig["seq"] > rk.acked:
                    self.procs.signal(rk.handle, sig["signal"])
                    rk.acked = sig["seq"]
                    log.info("agent: signal %s to rank %s of attempt %s", sig["signal"], rk.rank,
                             rk.attempt_id, extra=context(attempt=rk.attempt_id, node=self.node))
            for aid in reply["kill"]:
                rk = self.ranks.get(aid)
                if rk is not None:
                    self.procs.signal(rk.handle, signal.SIGKILL)
                    log.info("agent: killed rank %s of attempt %s (ended on the broker)", rk.rank,
                             rk.attempt_id, extra=context(attempt=rk.attempt_id, node=self.node))
            forget = [self.ranks[a] for a in reply["forget"] if a in self.ranks]
        for rk in forget:
            self.ship(rk)
            with self.lock:
                self.ranks.pop(rk.assignment_id, None)
            (self.procs.run_dir(rk.attempt_id, rk.rank) / "assignment.json").unlink(missing_ok=True)
        if reply["retire"]:
            with self.lock:
                for rk in self.ranks.values():
                    self.procs.signal(rk.handle, signal.SIGKILL)
            raise AgentError(f"node {self.node} is no longer part of the broker: stopping")

    def ship(self, rk: Rank) -> None:
        """Send the rank's new output (up to the end of its log file)."""
        path = Path(rk.handle["run_dir"]) / "output.log"
        if not path.exists():
            return
        with open(path, "rb") as f:
            while not self.stop.is_set():
                f.seek(rk.shipped)
                data = f.read(LOG_PIECE)
                if not data:
                    return
                r = self._post("/v1/agent/logs", {"assignment_id": rk.assignment_id,
                                                   "offset": rk.shipped,
                                                   "data_b64": base64.b64encode(data).decode()})
                new = int(r.json()["offset"])
                if new == rk.shipped:
                    return
                rk.shipped = new

    def notice(self, kind: str, deadline: float | None, detail: str) -> None:
        self._post("/v1/agent/notice", {"kind": kind, "deadline": deadline, "detail": {"text": detail}})

    # -- threads ----------------------------------------------------------------------------------
    def _loop(self, what: str, every: float, fn: Any) -> None:
        """Run fn() until stopped; a failure is logged and retried with backoff; AgentError
        stops the agent."""
        backoff = 0.5
        while not self.stop.is_set():
            try:
                fn()
                backoff = 0.5
            except AgentError as e:
                log.error("agent: %s", e)
                self.error = e
                self.stop.set()
                return
            except (httpx.HTTPError, OSError, ValueError) as e:
                log.warning("agent: %s failed (%s); retrying in %.1fs", what, e, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            if every:
                self.stop.wait(every)

    def _report_on_change(self) -> None:
        if self.changed.wait(1.0):
            self.changed.clear()
            self.sync(0.0)

    def _ship_all(self) -> None:
        with self.lock:
            ranks = list(self.ranks.values())
        for rk in ranks:
            self.ship(rk)

    def _watch(self) -> None:
        assert self.watcher is not None
        for n in self.watcher.poll():
            if n.kind not in self.reported_notices:
                log.warning("agent: %s notice from the metadata service", n.kind)
                self.notice(n.kind, n.deadline, n.detail)
                self.reported_notices.add(n.kind)

    def run(self) -> int:
        """Join, adopt, then serve until stopped (SIGTERM/SIGINT: ranks keep running and are
        adopted by the next agent). Returns the exit status: 0, or 3 when the server refused
        this agent."""
        backoff = 0.5
        while not self.stop.is_set() and not self.node:
            try:
                self.join()
            except AgentError as e:
                log.error("agent: %s", e)
                return 3
            except (httpx.HTTPError, OSError, ValueError) as e:
                log.warning("agent: cannot join yet (%s); retrying in %.1fs", e, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        if not self.node:
            return 0
        self.adopt()
        threads = [threading.Thread(target=self._loop, args=(n, e, f), daemon=True, name=n) for n, e, f in (
            ("sync", 0.0, lambda: self.sync(self.heartbeat_s)),
            ("report", 0.0, self._report_on_change),
            ("ship logs", 1.0, self._ship_all),
            *([("metadata", 2.0, self._watch)] if self.watcher else []),
            *([("gpu utilization", SAMPLE_S, self.sample_utilization)] if self.util else []))]
        for t in threads:
            t.start()
        while not self.stop.wait(0.5):
            pass
        for t in threads:
            t.join(timeout=2.0)
        return 3 if self.error is not None else 0


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


def main(server: str, join_token: str | None, state_dir: Path, gpus: Gpus,
         watcher: Watcher | None, metrics: tuple[str, int] | None = None) -> int:
    """`onepool agent`: run until SIGTERM/SIGINT. `metrics` (host, port): serve this node's
    Prometheus metrics there (broker.observe.agent_metrics) while it runs."""
    agent = Agent(server=server, state_dir=state_dir, gpus=gpus, join_token=join_token, watcher=watcher,
                  util=default_reader())
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: agent.stop.set())
    listener = None
    if metrics is not None:
        from broker.observe.agent_metrics import serve

        listener, port = serve(agent, *metrics)
        log.info("agent: metrics on http://%s:%d/metrics", metrics[0], port)
    try:
        return agent.run()
    finally:
        if listener is not None:
            listener.shutdown()  # type: ignore[attr-defined]

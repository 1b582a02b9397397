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

One job never stops the loops: a rank that cannot start (StartFailed, or any error of its
own) is reported as that attempt's start failure with its cause (providers.start_errors),
and an error handling one rank (a signal, its status, its log) is logged and that rank
skipped. The agent exits instead of staying up with a dead loop: 3 when the server refuses
it, 4 when a loop fails LOOP_FAILURES times in a row for a reason other than the server's,
or a loop thread dies (the loops: broker.agent.loops); its supervisor (systemd,
Restart=always) starts it again.

Fencing: every rank's supervisor stops the rank when the lease file is older than the
fence time the server gave (two thirds of the time after which the broker declares the node
lost; SIGKILL at most fence_grace_s later), so a node cut off from the server stops its work
before the broker places it again (broker.control.agents.Timing). Such a rank is reported
lost with cause `server_unreachable`. An outage shorter than the fence stops nothing: the
loops retry every second at most (retry_max_s) and the first sync after a failure does not
long-poll, so the lease is renewed within about a second of the server answering again; with
several server URLs (`--server URL1,URL2`) the one that answers is used (broker.failover).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broker import __version__, output_log
from broker.agent.gpu_util import Reader, default_reader, gpus_of
from broker.agent.hardware import Gpus
from broker.agent.loops import AgentError, AgentLoops
from broker.agent.metadata import Watcher
from broker.failover import make_client, split_urls
from broker.observe.logs import context
from broker.wire import SERVER_UNREACHABLE
from providers import start_errors
from providers.base import Handle, RankState, RankStatus, StartFailed
from providers.isolation import Isolation
from providers.local import LocalProcesses
from providers.local_runner import write_json

log = logging.getLogger("onepool.agent")
LOG_PIECE = 512 * 1024
# A sync's answer is due within its long poll's wait plus this (else: retried, maybe on the next
# server URL); connecting gives up after broker.failover.CONNECT_TIMEOUT_S.
SYNC_SLACK_S = 10.0


@dataclass
class Rank:
    assignment_id: int
    attempt_id: int
    rank: int
    handle: Handle
    shipped: int = 0
    acked: int = 0
    failed: RankStatus | None = None  # it could not start: how it ended (providers.start_errors)
    gpus: tuple[int, ...] = ()  # its GPU indices (CUDA_VISIBLE_DEVICES)
    util_sum: float = 0.0  # utilization samples since the last report (broker.agent.gpu_util)
    util_n: int = 0
    phases_sent: bool = False  # its restart phases were reported complete (broker.phases)


@dataclass
class Agent(AgentLoops):
    """A node agent. `server`: the server's URL, or several comma-separated (a standby: the
    one that answers is used, broker.failover). `http` is the client to the server (base_url
    set); tests may pass one."""

    server: str
    state_dir: Path
    gpus: Gpus
    join_token: str | None = None
    watcher: Watcher | None = None
    http: httpx.Client | None = None
    poll_timeout_s: float = 60.0
    stop: threading.Event = field(default_factory=threading.Event)
    retry_s: float = 0.25  # a loop's first wait after a failure, doubled up to retry_max_s
    retry_max_s: float = 1.0  # low: back within about a second of the server answering again
    isolation: Isolation | None = None  # who ranks run as, what they get (default: the host's)
    util: Reader | None = None  # GPU utilization (None: not reported)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state_dir, 0o700)
        self.http = self.http or make_client(self.server, self.poll_timeout_s + SYNC_SLACK_S)
        self.changed = threading.Event()
        self.procs = LocalProcesses(self.state_dir / "runs", on_change=self.changed.set,
                                    isolation=self.isolation)
        self.ranks: dict[int, Rank] = {}
        self.lock = threading.RLock()
        self.node = ""
        self.credential = ""
        self.heartbeat_s, self.fence_s = 5.0, 160.0
        self.fence_grace_s: float | None = None  # from the server (None: the job's grace)
        self.reported_notices: set[str] = set()
        self.error: AgentError | None = None
        self.connected = True  # the last sync was answered
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
        """Use the saved credential, unless a join token is given that is not the one it came
        from (a new --join-token wins: an admin's fresh token replaces a revoked or stale
        credential); else redeem the join token, sending the saved credential as proof that
        this is the node's agent restarting. Raises AgentError."""
        saved = self.state_dir / "agent.json"
        data = json.loads(saved.read_text()) if saved.exists() else {}
        mine = data if _same_server(data.get("server"), self.server) else {}
        if mine and (not self.join_token or mine.get("join_token_sha256") == _sha(self.join_token)):
            self._use_saved(mine)
            return
        if not self.join_token:
            raise AgentError(f"no saved credential in {saved} and no --join-token: ask an admin "
                             "for one (`onepool node join-token NODE`)")
        try:
            r = self._post("/v1/agent/join", {"join_token": self.join_token, "info": self._info(),
                                              "previous_credential": mine.get("credential")}, auth=False)
        except AgentError as e:
            if not mine:
                raise
            # a used or expired token beside a saved credential (a unit file that keeps the first
            # token; a credential saved before tokens were remembered): the credential decides
            log.warning("agent: the join token was refused (%s); using the saved credential", e)
            self._use_saved(mine)
            return
        reply = r.json()
        self.node, self.credential = reply["node"], reply["credential"]
        self.heartbeat_s, self.fence_s = reply["heartbeat_s"], reply["fence_s"]
        self.fence_grace_s = reply.get("fence_grace_s")
        tmp = saved.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"server": self.server, "node": self.node, "credential": self.credential,
                       "heartbeat_s": self.heartbeat_s, "fence_s": self.fence_s,
                       "join_token_sha256": _sha(self.join_token)}, f)
        tmp.replace(saved)
        self.lease.touch()
        log.info("agent: joined as node %s of pool %s", self.node, reply["pool"])

    def _use_saved(self, mine: dict[str, Any]) -> None:
        self.node, self.credential = mine["node"], mine["credential"]
        self.heartbeat_s, self.fence_s = mine.get("heartbeat_s", 5.0), mine.get("fence_s", 160.0)
        log.info("agent: node %s (saved credential)", self.node)

    def _post(self, path: str, body: dict[str, Any], *, auth: bool = True,
              timeout: float | None = None) -> httpx.Response:
        assert self.http is not None
        headers = {"Authorization": f"Bearer {self.credential}"} if auth else {}
        r = self.http.post(path, json=body, headers=headers,
                           timeout=timeout if timeout is not None else self.http.timeout)
        if r.status_code == 401:
            raise AgentError(f"the server refused this agent: {_message(r)}", refused=True)
        if r.status_code >= 400:
            raise httpx.HTTPStatusError(f"{r.status_code}: {_message(r)}", request=r.request, response=r)
        return r

    # -- ranks --------------------------------------------------------------------------------
    def adopt(self) -> None:
        """Take back the ranks a previous run of this agent started (still running or not yet
        reported), from their folders."""
        for f in sorted((self.state_dir / "runs").glob("attempt-*/rank-*/assignment.json")):
            try:
                a = json.loads(f.read_text())
                aid, attempt, rank = int(a["assignment_id"]), int(a["attempt_id"]), int(a["rank"])
                h = self.procs.adopt(attempt, rank)
            except (OSError, ValueError, KeyError, TypeError) as e:  # that rank's folder is damaged
                log.error("agent: cannot adopt the rank of %s (%s); the server ends it", f, e)
                continue
            if h is None:
                continue
            self.ranks[aid] = Rank(aid, attempt, rank, h, shipped=int(a.get("shipped", 0) or 0),
                                   gpus=tuple(int(g) for g in a.get("gpus", ()) if isinstance(g, int)))
            log.info("agent: adopted rank %s of attempt %s", rank, attempt,
                     extra=context(attempt=attempt, node=self.node))

    def _start(self, a: dict[str, Any]) -> None:
        """Start one assigned rank. Whatever goes wrong with it (StartFailed: its working
        directory, its command, its size; or any other error, e.g. of its folder) ends that
        rank as failed to start, with its cause, reported at the next sync; never the loop."""
        aid, attempt, rank = int(a["assignment_id"]), int(a["attempt_id"]), int(a["rank"])
        d = self.procs.run_dir(attempt, rank)
        try:
            env = {**a["env"], "ONEPOOL_AGENT_LEASE": str(self.lease),
                   "ONEPOOL_AGENT_FENCE_S": f"{self.fence_s:g}", "ONEPOOL_NODE_ID": self.node}
            if self.fence_grace_s is not None:
                env["ONEPOOL_AGENT_FENCE_GRACE_S"] = f"{self.fence_grace_s:g}"
            d.mkdir(parents=True, exist_ok=True)
            gpus = gpus_of(a["env"])
            (d / "assignment.json").write_text(json.dumps({"assignment_id": aid, "attempt_id": attempt,
                                                           "rank": rank, "gpus": gpus}))
            h = self.procs.start(attempt, rank, list(a["argv"]), env, recover=True)
        except StartFailed as e:  # its working directory, its command, its size: its own
            self._failed_start(aid, attempt, rank, e.cause, str(e))
            return
        except Exception as e:  # anything else with this one rank: it fails alone
            log.exception("agent: rank %s of attempt %s: cannot start it", rank, attempt)
            self._failed_start(aid, attempt, rank, start_errors.cause(_kind(e)), f"{type(e).__name__}: {e}")
            return
        self.ranks[aid] = Rank(aid, attempt, rank, h, gpus=tuple(gpus))
        log.info("agent: rank %s of attempt %s started (pid %s)", rank, attempt, h["pid"],
                 extra=context(attempt=attempt, node=self.node))

    def _failed_start(self, aid: int, attempt: int, rank: int, cause: str, why: str) -> None:
        """Record a rank that could not start: reported as exited with its `cause`. Its folder
        gets the reason (output.log, shipped as its log) and the status (exit.json), if it can
        be written; the status is kept in memory either way."""
        log.warning("agent: rank %s of attempt %s could not start (%s): %s", rank, attempt, cause, why)
        kind = start_errors.kind_of(cause) or ""
        status = {"code": start_errors.exit_code(kind), "start_error": {"cause": cause, "message": why[:500]}}
        d = self.procs.run_dir(attempt, rank)
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(d / "output.log", "a") as f:
                f.write(f"onepool agent: cannot start the rank on node {self.node}: {why}\n")
            write_json(d / "exit.json", status)
        except OSError as e:
            log.error("agent: cannot record the failed start of rank %s of attempt %s in %s: %s",
                      rank, attempt, d, e)
        self.ranks[aid] = Rank(aid, attempt, rank, {"rank": rank, "pid": -1, "create_time": 0.0,
                                                    "pgid": -1, "run_dir": str(d)},
                               failed=RankStatus(RankState.EXITED, int(status["code"]), cause=cause))

    def _reports(self) -> list[dict[str, Any]]:
        out = []
        for r in self.ranks.values():
            try:
                st = r.failed or self._status(r)
            except Exception:  # its folder cannot be read: it is killed and reported lost
                log.exception("agent: rank %s of attempt %s: cannot read its state", r.rank, r.attempt_id)
                st = RankStatus(RankState.LOST)
                with contextlib.suppress(Exception):
                    self.procs.kill(r.handle)
            # ORPHANED still: reported running, so the broker starts no other attempt while a
            # process of this one lives (it is killed again at the next report)
            state = {RankState.RUNNING: "running", RankState.ORPHANED: "running",
                     RankState.EXITED: "exited"}.get(st.state, "lost")
            fenced = st.cause == "fenced"  # it stopped itself, cut off from the server: not the
            if fenced:                      # job's failure; the broker requeues it (the outage's loss)
                state = "lost"
            code = st.exit_code
            if code is not None and not -255 <= code <= 255:  # its folder says so: the job wrote it
                code = 255
            pid = r.handle.get("pid")
            if not isinstance(pid, int) or not 0 <= pid < 1 << 31:  # none (a failed start) or forged
                pid = None
            rep = {"assignment_id": r.assignment_id, "state": state, "pid": pid, "exit_code": code,
                   "gpu_util_pct": round(r.util_sum / r.util_n, 2) if r.util_n else None}
            r.util_sum, r.util_n = 0.0, 0
            if not r.phases_sent and r.failed is None and (ph := self.procs.phases(r.handle)) is not None:
                rep["phases"], r.phases_sent = ph, not ph.get("pending")
            if state == "exited" and start_errors.well_formed(st.cause):
                rep["cause"] = st.cause
            elif fenced:
                rep["cause"] = SERVER_UNREACHABLE
            out.append(rep)
        return out

    def _status(self, r: Rank) -> RankStatus:
        st = self.procs.status(r.handle)
        if st.state == RankState.ORPHANED:  # its supervisor died; what it left dies first
            self.procs.kill(r.handle)
            log.warning("agent: the supervisor of rank %s of attempt %s died; its processes "
                        "were killed", r.rank, r.attempt_id)
            st = self.procs.status(r.handle)
        return st

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
        """One sync: report, then act on the answer. Raises AgentError, httpx errors. The first
        after a failed one asks for an answer at once (wait 0), not a long poll: an agent back
        from an outage renews its lease (its ranks' fence) and catches up right away."""
        if not self.connected:
            wait_s = 0.0
        images = self.procs.images.get()  # (a runtime's listing, at most once a minute: outside the lock)
        with self.lock:
            body = {"ranks": self._reports(), "known": list(self.ranks),
                    "acked": {str(k): r.acked for k, r in self.ranks.items() if r.acked},
                    "wait_s": wait_s, "code_held": self.procs.code.holds()[:64], "images_held": images}
        try:
            r = self._post("/v1/agent/sync", body, timeout=wait_s + SYNC_SLACK_S)
        except (AgentError, httpx.HTTPError, OSError):
            self.syncs["error"] += 1
            self.connected = False
            raise
        self.syncs["ok"] += 1
        self.connected = True
        os.utime(self.lease) if self.lease.exists() else self.lease.touch()
        self._apply(r.json())

    def _apply(self, reply: dict[str, Any]) -> None:
        with self.lock:
            self.heartbeat_s, self.fence_s = reply["heartbeat_s"], reply["fence_s"]
            self.fence_grace_s = reply.get("fence_grace_s")
            for a in reply["assignments"]:
                if a["assignment_id"] not in self.ranks:
                    self._start(a)
            for sig in reply["signals"]:
                rk = self.ranks.get(sig["assignment_id"])
                if rk is not None and sig["seq"] > rk.acked:
                    with self._one(rk, f"signal {sig['signal']}"):
                        self.procs.signal(rk.handle, sig["signal"])
                    rk.acked = sig["seq"]
                    log.info("agent: signal %s to rank %s of attempt %s", sig["signal"], rk.rank,
                             rk.attempt_id, extra=context(attempt=rk.attempt_id, node=self.node))
            for aid in reply["kill"]:
                rk = self.ranks.get(aid)
                if rk is not None:
                    with self._one(rk, "kill"):
                        self.procs.signal(rk.handle, signal.SIGKILL)
                    log.info("agent: killed rank %s of attempt %s (ended on the broker)", rk.rank,
                             rk.attempt_id, extra=context(attempt=rk.attempt_id, node=self.node))
            forget = [self.ranks[a] for a in reply["forget"] if a in self.ranks]
        for rk in forget:
            with self._one(rk, "ship its last output"):
                self.ship(rk)
            with self.lock:
                self.ranks.pop(rk.assignment_id, None)
            with self._one(rk, "forget"):
                (self.procs.run_dir(rk.attempt_id, rk.rank) / "assignment.json").unlink(missing_ok=True)
        if reply["retire"]:
            with self.lock:
                for rk in self.ranks.values():
                    self.procs.signal(rk.handle, signal.SIGKILL)
            raise AgentError(f"node {self.node} is no longer part of the broker: stopping", refused=True)

    def ship(self, rk: Rank) -> None:
        """Send the rank's new output (up to the end of its capped log: broker.output_log).
        Output the node's cap dropped before it was shipped is skipped; the server counts it
        as dropped too."""
        run_dir = Path(rk.handle["run_dir"])
        while not self.stop.is_set():
            start, data = output_log.read(run_dir, rk.shipped, LOG_PIECE)
            if not data:
                return
            r = self._post("/v1/agent/logs", {"assignment_id": rk.assignment_id, "offset": start,
                                               "data_b64": base64.b64encode(data).decode()})
            new = int(r.json()["offset"])
            if new == rk.shipped:
                return
            rk.shipped = new

    @contextlib.contextmanager
    def _one(self, rk: Rank, what: str) -> Iterator[None]:
        """Handle one rank: an error of its own (a handle or folder it broke, an answer the
        server gave about it) is logged and that rank skipped; the loop goes on. The agent's
        own failures (refused, server unreachable) propagate."""
        try:
            yield
        except (AgentError, httpx.TransportError):
            raise
        except Exception:
            log.exception("agent: rank %s of attempt %s: %s failed; going on", rk.rank, rk.attempt_id, what)

    def notice(self, kind: str, deadline: float | None, detail: str) -> None:
        self._post("/v1/agent/notice", {"kind": kind, "deadline": deadline, "detail": {"text": detail}})



def _kind(e: BaseException) -> str:
    """A start-failure kind for an unexpected error starting a rank: its errno's name for an
    OSError (`enospc`), else `agent_error`."""
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, "agent_error").lower()
    return "agent_error"


def _same_server(saved: Any, server: str) -> bool:
    """Whether a credential saved for `saved` (its --server) serves `server`: they share a URL
    (a standby URL added to --server keeps the credential)."""
    if not isinstance(saved, str):
        return False
    try:
        return bool(set(split_urls(saved)) & set(split_urls(server)))
    except ValueError:
        return False


def _sha(token: str) -> str:
    """What the saved credential remembers of the join token it came from."""
    return hashlib.sha256(token.encode()).hexdigest()


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


def main(server: str, join_token: str | None, state_dir: Path, gpus: Gpus,
         watcher: Watcher | None, isolation: Isolation | None = None,
         metrics: tuple[str, int] | None = None) -> int:
    """`onepool agent`: run until SIGTERM/SIGINT. `metrics` (host, port): serve this node's
    Prometheus metrics there (broker.observe.agent_metrics) while it runs."""
    agent = Agent(server=server, state_dir=state_dir, gpus=gpus, join_token=join_token, watcher=watcher,
                  isolation=isolation, util=default_reader())
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

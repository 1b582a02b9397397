"""A flood of bad tokens and oversized bodies against a real `onepool server` (issue 24, parts 3
and 6). Goal: under 200 bad requests/s, a valid client keeps >= 80% of its unloaded
throughput, and no running job is fenced.

    .venv/bin/python bench/auth_flood.py [--seconds 10] [--rate 200] [--quick]
                                         [--attacker-address 127.0.0.1]
        -> bench/results/auth_flood.json

What it runs (about 50 s; --quick: about 25 s), all on loopback and stopping by itself:
`onepool server` as its own process with the broker loop (SQLite, one uvicorn worker), a real
`onepool agent` process on node hosts-0 running one job (a rank that sleeps), and, in this
process:

- the valid client: `valid_connections` keep-alive connections, each reading
  `GET /v1/jobs/ID` with a member token back to back (closed loop);
- the attacker: `rate` requests a second, paced over `attack_connections` keep-alive
  connections, the same route with the valid token's id and a wrong secret (the costliest
  bad token: its id exists);
- an agent's sync probe: node hosts-1's credential, `POST /v1/agent/sync` every 0.2 s, its
  latency recorded;
- a body flood (last): 32 connections at once, each posting a job body declared as 50 MB
  without a token and writing it 1 MB at a time until answered; the server's RSS before and
  after.

All of them, the agent included, come from 127.0.0.1 by default: the attacker shares its
address with the valid client and the agent (as behind a NAT, or a hostile job on the
agent's node), the hard case for a per-address limit. `--attacker-address 127.0.0.2` gives it
an address of its own (Linux routes all of 127/8 to loopback).

Phases: unloaded (valid client and probe only); flood with the server's default limits (the
attacker's address is answered 429 after 20 failures); flood with the per-address limit
raised out of reach (every bad request reaches the token check: what the fast hash alone
costs); then the body flood. The job must still run its first attempt at the end: its agent
fences ranks after 4 s without a successful sync (node_lost_after_s 6), so a starved agent
would show.

Assumptions (in the JSON): one machine, 2 cores shared by the server, the agent and this
load generator (which works against the server); loopback, no TLS; the attacker knows a
token id (ids are public: events name them) but not its secret; the attacker uses one
address (phase 3 shows the cost when the limit is out of reach, as for a flood from many
addresses); SQLite on local disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_submit import cpu_s  # noqa: E402
from broker.client.demo_site import free_port  # noqa: E402
from broker.client.sdk import Client  # noqa: E402
from broker.errors import SpecError  # noqa: E402
from broker.spec import parse_config  # noqa: E402

HOME_ADDRESS = "127.0.0.1"  # the valid client's, the agents' and the body flood's
TIMING = {"node_lost_after_s": 6.0, "agent_heartbeat_s": 1.0}  # ranks fence after 4 s
REQUEST_TIMEOUT_S = 5.0  # a request not answered by then counts as "timeout"


def config(api: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"pools": [{"name": "hosts", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 1,
                       "nodes": 2}],
            "teams": [{"name": "research"}, {"name": "prod"}],
            "broker": {"cycle_s": 1.0, **TIMING, **({"api": api} if api else {})}}


class Conn:
    """One keep-alive HTTP/1.1 connection from a chosen source address, written by hand (about
    0.1 ms of CPU per request, where httpx costs several: the generator shares the cores)."""

    def __init__(self, port: int, source: str) -> None:
        self.port, self.source = port, source
        self.rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, method: str, path: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.rw is None:
            self.rw = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(self.source, 0))
        reader, writer = self.rw
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        writer.write(head + body)
        status = await reader.readline()
        length, close = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        payload = await reader.readexactly(length)
        if close:
            self.close()
        return int(status.split()[1]), payload

    async def ask(self, method: str, path: str, token: str, body: bytes = b"") -> int | str:
        """The answer's status, or "timeout" (none within REQUEST_TIMEOUT_S) or "connection
        error"; after either, the next request opens a new connection."""
        try:
            return (await asyncio.wait_for(self.request(method, path, token, body), REQUEST_TIMEOUT_S))[0]
        except TimeoutError:
            self.close()
            return "timeout"
        except (ConnectionError, asyncio.IncompleteReadError):
            self.close()
            return "connection error"

    def close(self) -> None:
        if self.rw is not None:
            self.rw[1].close()
            self.rw = None


async def valid_loop(port: int, token: str, job: int, until: float, lat: list[float], bad: Counter) -> None:
    conn = Conn(port, HOME_ADDRESS)
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            code = await conn.ask("GET", f"/v1/jobs/{job}", token)
            if code == 200:
                lat.append(time.perf_counter() - t0)
            else:
                bad[code] += 1
    finally:
        conn.close()


async def attack_loop(port: int, source: str, token: str, job: int, rate: float, until: float,
                      seen: Counter) -> None:
    """Send at `rate` a second on one connection until `until` (slots missed while the server
    was slow to answer are skipped, not made up)."""
    conn, step, t = Conn(port, source), 1.0 / rate, time.perf_counter()
    try:
        while t < until:
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            seen[await conn.ask("GET", f"/v1/jobs/{job}", token)] += 1
            t = max(t + step, time.perf_counter())
    finally:
        conn.close()


async def probe_loop(port: int, credential: str, until: float, lat: list[float], bad: Counter) -> None:
    conn = Conn(port, HOME_ADDRESS)
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            code = await conn.ask("POST", "/v1/agent/sync", credential, b'{"wait_s": 0}')
            if code == 200:
                lat.append(time.perf_counter() - t0)
            else:
                bad[code] += 1
            await asyncio.sleep(0.2)
    finally:
        conn.close()


def quantiles_ms(xs: list[float]) -> dict[str, float | None]:
    ms = sorted(x * 1000 for x in xs)
    if not ms:
        return {"p50": None, "p99": None, "max": None}
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) >= 2 else [ms[0]] * 99
    return {"p50": round(q[49], 2), "p99": round(q[98], 2), "max": round(ms[-1], 2)}


async def attack(a: argparse.Namespace, token: str, job: int, port: int, until: float) -> Counter:
    seen: Counter = Counter()
    each = a.rate / a.attack_connections
    await asyncio.gather(*(attack_loop(port, a.attacker_address, token, job, each, until, seen)
                           for _ in range(a.attack_connections)))
    return seen


def attacker_process(a: argparse.Namespace, token: str, job: int, port: int, start: float,
                     out: Any) -> None:
    """The attacker, in a process of its own so it does not share the valid client's event
    loop: sleeps until `start` (a time.time()), attacks for a.seconds, puts (answers, CPU s)."""
    time.sleep(max(0.0, start - time.time()))
    got = asyncio.run(attack(a, token, job, port, time.perf_counter() + a.seconds))
    out.put((dict(got), time.process_time()))


async def phase(a: argparse.Namespace, port: int, pid: int, s: dict[str, Any],
                start: float) -> dict[str, Any]:
    """The valid client and the probe for a.seconds from `start` (a time.time())."""
    await asyncio.sleep(max(0.0, start - time.time()))
    lat: list[float] = []
    sync: list[float] = []
    valid_bad: Counter = Counter()
    sync_bad: Counter = Counter()
    cpu0, gen0, t0 = cpu_s(pid), time.process_time(), time.perf_counter()
    until = t0 + a.seconds
    jobs = [valid_loop(port, s["token"], s["job"], until, lat, valid_bad) for _ in range(a.valid_connections)]
    jobs.append(probe_loop(port, s["credential"], until, sync, sync_bad))
    await asyncio.gather(*jobs)
    wall = time.perf_counter() - t0
    return {"valid_requests_per_s": round(len(lat) / wall, 1), "valid_latency_ms": quantiles_ms(lat),
            "valid_errors": dict(valid_bad),
            "agent_sync_latency_ms": quantiles_ms(sync), "agent_sync_errors": dict(sync_bad),
            "cpu_percent": {"server": round((cpu_s(pid) - cpu0) / wall * 100, 1),
                            "valid_client_and_probe": round((time.process_time() - gen0) / wall * 100, 1)},
            "seconds": round(wall, 2)}


def measured(a: argparse.Namespace, port: int, pid: int, s: dict[str, Any], flood: bool) -> dict[str, Any]:
    """One phase; with `flood`, the attacker's process runs beside it (started first: a new
    Python process takes a second or two to import)."""
    ctx = multiprocessing.get_context("spawn")
    answers = ctx.Queue()
    start = time.time() + 3.0
    attacker = None
    if flood:
        attacker = ctx.Process(target=attacker_process,
                               args=(a, s["bad_token"], s["job"], port, start, answers))
        attacker.start()
    got = asyncio.run(phase(a, port, pid, s, start))
    seen: dict[Any, int] = {}
    if attacker is not None:
        seen, attacker_cpu = answers.get(timeout=a.seconds + 3 * REQUEST_TIMEOUT_S + 30)
        attacker.join(timeout=30)
        got["cpu_percent"]["attacker_process_total"] = round(attacker_cpu / a.seconds * 100, 1)
    got["attack_sent_per_s"] = round(sum(seen.values()) / got["seconds"], 1)
    got["attack_answers"] = {str(k): v for k, v in seen.items()}
    return got


def rss_mb(pid: int) -> dict[str, float]:
    got = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = round(int(value.split()[0]) / 1024, 1)
    return got


async def body_flood(port: int, n: int = 32, mb: int = 50) -> dict[str, Any]:
    """`n` connections at once, each posting a `mb` MB job body without a token."""
    chunk = b" " * (1024 * 1024)

    async def one() -> tuple[str, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(HOME_ADDRESS, 0))
        writer.write((f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {mb * 1024 * 1024}\r\n\r\n").encode())
        sent = 0
        answer = asyncio.ensure_future(reader.readline())
        try:
            while sent < mb and not answer.done():
                writer.write(chunk)
                try:
                    await writer.drain()
                except ConnectionError:
                    break
                sent += 1
            status = await asyncio.wait_for(answer, 30)
            return (status.split()[1].decode() if status else "closed"), sent
        finally:
            writer.close()

    got = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    statuses = Counter(g[0] if isinstance(g, tuple) else type(g).__name__ for g in got)
    sent = [g[1] for g in got if isinstance(g, tuple)]
    return {"requests": n, "declared_mb_each": mb, "answers": dict(statuses),
            "mb_written_before_the_answer_max": max(sent, default=0)}


def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def run(a: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="onepool-flood-"))
    local = Client(home / "server")
    local.apply(parse_config(config()))
    token = local.create_token("research").token or ""
    tid = token.split("_")[1]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cli = [sys.executable, "-m", "broker.client.cli"]
    log = open(home / "processes.log", "w")  # noqa: SIM115  (closed below)
    server = subprocess.Popen([*cli, "--home", str(home / "server"), "server", "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    agent = None
    try:
        wait_until("the server", lambda: healthy(url), 30)
        join = local.join_token("hosts-0").join_token
        agent = subprocess.Popen([*cli, "agent", "--server", url, "--join-token", join, "--gpus", "1",
                                  "--gpu-type", "A100", "--state-dir", str(home / "agent")],
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
        job = local.submit(name="sleeper", team="research", gpus_per_node=1,
                           command=[sys.executable, "-c", "import time; time.sleep(3600)"]).id
        wait_until("the job to run on hosts-0", lambda: local.get(job).status == "RUNNING", 60)
        probe_join = local.join_token("hosts-1").join_token
        probe = httpx.post(f"{url}/v1/agent/join", json={"join_token": probe_join})
        probe.raise_for_status()
        s = {"token": token, "bad_token": f"op_{tid}_{'x' * 43}", "job": job,
             "credential": probe.json()["credential"]}
        phases: dict[str, Any] = {}
        phases["unloaded"] = measured(a, port, server.pid, s, flood=False)
        phases["flood_default_limits"] = measured(a, port, server.pid, s, flood=True)
        big = {"auth_failure_burst": 1_000_000, "auth_failures_per_s": 1_000_000.0}
        try:
            local.apply(parse_config(config(api=big)))
            time.sleep(6.0)  # the server re-reads its limits every 5 s
            phases["flood_without_address_limit"] = measured(a, port, server.pid, s, flood=True)
        except SpecError as e:  # a checkout from before broker.api (measuring the old code)
            print(f"no third phase: {e}", file=sys.stderr)
        bodies: dict[str, Any] = {"skipped": "--no-body-flood"}
        if not a.no_body_flood:
            before = rss_mb(server.pid)
            bodies = asyncio.run(body_flood(port))
            bodies["server_rss_mb_before"], bodies["server_rss_mb_after"] = before, rss_mb(server.pid)
        info = local.get(job)
        attempts = [{"state": x.state, "end_reason": x.end_reason, "cause": x.cause}
                    for x in info.attempt_list]
        local.cancel(job)
    finally:
        for p in (agent, server):
            if p is not None:
                p.terminate()
        for p in (agent, server):
            if p is not None:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        log.close()
        local.store.dispose()
        shutil.rmtree(home, ignore_errors=True)
    base = phases["unloaded"]["valid_requests_per_s"] or 1.0
    for name in [n for n in ("flood_default_limits", "flood_without_address_limit") if n in phases]:
        phases[name]["valid_share_of_unloaded"] = round(phases[name]["valid_requests_per_s"] / base, 3)
    fenced = info.status != "RUNNING" or len(attempts) != 1
    return {"phases": phases, "body_flood": bodies,
            "job": {"status_before_cancel": info.status, "attempts": attempts, "fenced_or_requeued": fenced},
            "goal": {"what": "under the flood with the server's default limits, the valid client "
                             "keeps >= 80% of its unloaded throughput; no job fenced or requeued",
                     "met": not fenced and phases["flood_default_limits"]["valid_share_of_unloaded"] >= 0.8}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each load phase")
    ap.add_argument("--rate", type=float, default=200.0, help="bad requests a second")
    ap.add_argument("--valid-connections", type=int, default=4)
    ap.add_argument("--attack-connections", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="3-second phases")
    ap.add_argument("--attacker-address", default=HOME_ADDRESS,
                    help="the attacker's source address (default: the valid client's and the agents')")
    ap.add_argument("--no-body-flood", action="store_true",
                    help="skip the body flood (for older checkouts: 32 x 50 MB reach their memory)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "auth_flood.json")
    a = ap.parse_args()
    if a.quick:
        a.seconds = 3.0
    load_avg = os.getloadavg()[0]
    result = run(a)
    result["scenario"] = {
        "seconds_per_phase": a.seconds, "bad_requests_per_s": a.rate,
        "valid_connections": a.valid_connections, "attack_connections": a.attack_connections,
        "attacker_address": a.attacker_address, "others_address": HOME_ADDRESS,
        "bad_token": "a real token id with a wrong secret", "agent_timing": TIMING,
        "assumptions": ["one machine: server, agent and load generator share its cores",
                        "loopback, no TLS; SQLite on local disk; one uvicorn worker",
                        "one attacking address (the third phase lifts the per-address limit, as a "
                        "flood from many addresses would)",
                        "the valid client and the agents used their credentials before the flood "
                        "(a credential seen passing is served from a throttled address)",
                        "the load generator writes HTTP by hand (about 0.1 ms of CPU a request)"],
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "load_average_before": round(load_avg, 2)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, p in result["phases"].items():
        share = p.get("valid_share_of_unloaded")
        print(f"{name}: valid {p['valid_requests_per_s']}/s"
              + (f" ({share:.0%} of unloaded)" if share is not None else "")
              + f", p99 {p['valid_latency_ms']['p99']} ms; attack {p['attack_sent_per_s']}/s "
              f"{p['attack_answers']}; agent sync p99 {p['agent_sync_latency_ms']['p99']} ms; "
              f"CPU % {p['cpu_percent']}")
    b = result["body_flood"]
    if "answers" in b:
        print(f"body flood: {b['answers']}, server RSS {b['server_rss_mb_before']} -> "
              f"{b['server_rss_mb_after']} MB")
    print(f"job: {result['job']}; goal met: {result['goal']['met']}  -> {a.out}")


if __name__ == "__main__":
    main()

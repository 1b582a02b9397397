"""Submits per second and latency through the HTTP API (issue 9's goal: >= 500/s, p99 < 50 ms
on SQLite on 2 cores).

    .venv/bin/python bench/api_submit.py [--seconds 10] [--concurrency 16] [--runs 3]
                                         [--client raw|httpx] [--broker]
        -> bench/results/api_submit.json

What it runs, `--runs` times (each with a fresh home): `onepool server` as its own process
(one uvicorn worker, SQLite in WAL mode with synchronous=FULL on local disk, so every commit
waits for its fsync; `--no-broker` unless --broker), and a load generator in this process:
`concurrency` clients on their own keep-alive connections, each posting jobs back to back
with a member token for `seconds` after a 2-second warm-up. Every submit carries a unique
Idempotency-Key, as the SDK sends. A submit counts once its 201 is read, i.e. after the
commit that holds it.

The load generator (default `--client raw`) writes HTTP/1.1 requests on asyncio streams and
parses the status line, headers and body of each answer: about 0.1 ms of CPU per request,
where httpx (the SDK's client, `--client httpx`) costs several ms. Real clients run on other
machines; here the generator shares the 2 cores with the server, so the cheaper it is, the
closer the figure is to the server's. The JSON reports both processes' CPU time per submit
and the machine's load average before each run (the machine may be shared).

Assumptions that favour onepool (reported in the JSON): client and server share loopback (no
network latency); all clients use one member token (a batch reads each distinct token's row
once; each check of it is one salted HMAC, microseconds); the config is small (3 pools, 2
teams, no budgets); without --broker no broker loop competes for the database or the CPU.
The load generator shares the 2 cores with the server, which works against it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.client.demo_site import free_port  # noqa: E402
from broker.client.sdk import Client  # noqa: E402
from broker.spec import parse_config  # noqa: E402

CONFIG = {
    "pools": [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 4},
              {"name": "l4", "gpu_type": "L4", "gpus_per_node": 4, "nodes": 2},
              {"name": "hosts", "provider": "agent", "gpu_type": "H100", "gpus_per_node": 8, "nodes": 8}],
    "teams": [{"name": "research"}, {"name": "prod"}],
    "broker": {"cycle_s": 1.0},
}
JOB = {"name": "bench", "command": ["python", "train.py"], "gpus_per_node": 1, "priority": "normal"}


async def client_loop(http: httpx.AsyncClient, until: float, lat: list[float], errors: list[str]) -> None:
    while time.perf_counter() < until:
        t0 = time.perf_counter()
        r = await http.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": str(uuid.uuid4())})
        dt = time.perf_counter() - t0
        if r.status_code == 201:
            lat.append(dt)
        else:
            errors.append(f"{r.status_code}: {r.text[:200]}")


async def raw_loop(url: str, token: str, until: float, lat: list[float], errors: list[str]) -> None:
    """One keep-alive connection posting JOB until `until`: HTTP/1.1 written by hand, each
    answer read whole (status line, headers, Content-Length body) before the next request."""
    hostport = url.removeprefix("http://")
    host, port = hostport.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(JOB).encode()
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: {hostport}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n").encode()
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            writer.write(head + b"Idempotency-Key: " + uuid.uuid4().hex.encode() + b"\r\n\r\n" + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            payload = await reader.readexactly(length)
            dt = time.perf_counter() - t0
            code = int(status.split()[1])
            if code == 201 and json.loads(payload).get("id"):
                lat.append(dt)
            else:
                errors.append(f"{code}: {payload[:200]!r}")
    finally:
        writer.close()


async def load(url: str, token: str, seconds: float, concurrency: int, client: str,
               on_start: Callable[[], None]) -> tuple[list[float], list[str], float]:
    """Warm up for 2 s, call on_start, then measure for `seconds`."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                 limits=limits, timeout=30) as http:
        def loop(until: float, lat: list[float], errors: list[str]) -> Coroutine[Any, Any, None]:
            if client == "raw":
                return raw_loop(url, token, until, lat, errors)
            return client_loop(http, until, lat, errors)

        warm: list[float] = []
        await asyncio.gather(*(loop(time.perf_counter() + 2.0, warm, []) for _ in range(concurrency)))
        lat: list[float] = []
        errors: list[str] = []
        on_start()
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(t0 + seconds, lat, errors) for _ in range(concurrency)))
        return lat, errors, time.perf_counter() - t0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(a: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="onepool-bench-"))
    local = Client(home)
    local.apply(parse_config(CONFIG))
    token = local.create_token("research").token or ""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    load_avg = os.getloadavg()[0]
    server = subprocess.Popen([sys.executable, "-m", "broker.client.cli", "--home", str(home), "server",
                               "--port", str(port), *([] if a.broker else ["--no-broker"])],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    start: dict[str, float] = {}

    def on_start() -> None:
        start.update(server=cpu_s(server.pid), gen=time.process_time())

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/v1/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.1)
        lat, errors, wall = asyncio.run(load(url, token, a.seconds, a.concurrency, a.client, on_start))
        server_cpu, gen_cpu = cpu_s(server.pid) - start["server"], time.process_time() - start["gen"]
    finally:
        server.terminate()
        server.wait(timeout=15)
        local.store.dispose()
        shutil.rmtree(home, ignore_errors=True)
    lat_ms = sorted(x * 1000 for x in lat)
    q = statistics.quantiles(lat_ms, n=100) if len(lat_ms) >= 100 else [float("nan")] * 99
    n = max(1, len(lat))
    return {"submits": len(lat), "errors": len(errors), "first_errors": errors[:3],
            "seconds": round(wall, 2), "submits_per_s": round(len(lat) / wall, 1),
            "latency_ms": {"p50": round(q[49], 2), "p90": round(q[89], 2), "p99": round(q[98], 2),
                           "max": round(lat_ms[-1], 2) if lat_ms else None},
            "cpu_ms_per_submit": {"server": round(server_cpu / n * 1000, 3),
                                  "load_generator": round(gen_cpu / n * 1000, 3)},
            "load_average_before": round(load_avg, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--client", choices=["raw", "httpx"], default="raw")
    ap.add_argument("--broker", action="store_true", help="run the broker loop in the server too")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_submit.json")
    a = ap.parse_args()
    runs = []
    for i in range(a.runs):
        runs.append(one_run(a))
        r = runs[-1]
        print(f"run {i + 1}: {r['submits_per_s']}/s, p50 {r['latency_ms']['p50']} ms, p99 "
              f"{r['latency_ms']['p99']} ms, server CPU {r['cpu_ms_per_submit']['server']} ms/submit, "
              f"load average {r['load_average_before']}", file=sys.stderr)
    by_rate = sorted(runs, key=lambda r: r["submits_per_s"])
    best, median = by_rate[-1], by_rate[len(by_rate) // 2]
    result = {
        "best": best, "median": median, "runs": runs,
        "goal": {"submits_per_s": 500, "p99_ms": 50},
        "setup": {"concurrency": a.concurrency, "broker_loop": a.broker,
                  "database": "sqlite (WAL, synchronous=FULL)", "server_processes": 1,
                  "uvicorn_workers": 1, "http_parser": "httptools", "load_generator": a.client,
                  "seconds_per_run": a.seconds, "cpus": os.cpu_count(),
                  "python": platform.python_version()},
        "notes": ["best and median are runs ranked by submits/s; the machine is shared with other "
                  "engineers' work (see load_average_before), which inflates latency and CPU time"],
        "assumptions_favouring_onepool": [
            "client and server on loopback (no network latency)",
            "one member token for all clients: a batch reads its row once and checks its "
            "salted HMAC (microseconds)",
            "small config (3 pools, 2 teams, no budgets)",
            *([] if a.broker else ["no broker loop competing for CPU and the database"]),
            *(["a minimal HTTP/1.1 load generator (~0.1 ms CPU per request) rather than the "
               "SDK's httpx"] if a.client == "raw" else []),
        ],
        "against_onepool": ["the load generator shares the 2 cores with the server",
                            "every commit waits for its fsync (synchronous=FULL)"],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("best", "median", "setup")}, indent=2))


if __name__ == "__main__":
    main()

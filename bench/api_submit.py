"""Submits per second and latency through the HTTP API (issue 9's goal: >= 500/s, p99 < 50 ms
on SQLite on 2 cores).

    .venv/bin/python bench/api_submit.py [--seconds 10] [--concurrency 16] [--broker]
        -> bench/results/api_submit.json

What it runs: `onepool server` as its own process (one uvicorn worker, SQLite in WAL mode on
local disk, `--no-broker` unless --broker), and a load generator in this process: `concurrency`
asyncio clients, each posting jobs back to back with a member token for `seconds` after a
2-second warm-up. Every submit carries a unique Idempotency-Key, as the SDK sends.

Assumptions that favour onepool (reported in the JSON): client and server share loopback (no
network latency); the token's argon2 check is paid once per server process (later requests
are verified from a cache); the config is small (3 pools, 2 teams); without --broker no
broker loop competes for the database or the CPU. The load generator shares the 2 cores with
the server, which works against it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

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


async def load(url: str, token: str, seconds: float,
               concurrency: int) -> tuple[list[float], list[str], float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                 limits=limits, timeout=30) as http:
        warm: list[float] = []
        await asyncio.gather(*(client_loop(http, time.perf_counter() + 2.0, warm, [])
                               for _ in range(concurrency)))
        lat: list[float] = []
        errors: list[str] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(http, t0 + seconds, lat, errors) for _ in range(concurrency)))
        return lat, errors, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--broker", action="store_true", help="run the broker loop in the server too")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_submit.json")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="onepool-bench-"))
    local = Client(home)
    local.apply(parse_config(CONFIG))
    token = local.create_token("research").token or ""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    server = subprocess.Popen([sys.executable, "-m", "broker.client.cli", "--home", str(home), "server",
                               "--port", str(port), *([] if a.broker else ["--no-broker"])],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
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
        lat, errors, wall = asyncio.run(load(url, token, a.seconds, a.concurrency))
    finally:
        server.terminate()
        server.wait(timeout=15)
    lat_ms = sorted(x * 1000 for x in lat)
    q = statistics.quantiles(lat_ms, n=100) if len(lat_ms) >= 100 else [float("nan")] * 99
    result = {
        "submits": len(lat), "errors": len(errors), "first_errors": errors[:3],
        "seconds": round(wall, 2), "submits_per_s": round(len(lat) / wall, 1),
        "latency_ms": {"p50": round(q[49], 2), "p90": round(q[89], 2), "p99": round(q[98], 2),
                       "max": round(lat_ms[-1], 2) if lat_ms else None},
        "goal": {"submits_per_s": 500, "p99_ms": 50},
        "setup": {"concurrency": a.concurrency, "broker_loop": a.broker, "database": "sqlite (WAL)",
                  "server_processes": 1, "cpus": os.cpu_count(), "python": platform.python_version()},
        "assumptions_favouring_onepool": [
            "client and server on loopback (no network latency)",
            "argon2 token check paid once per server process, then cached",
            "small config (3 pools, 2 teams)",
            *([] if a.broker else ["no broker loop competing for CPU and the database"]),
        ],
        "against_onepool": ["the load generator shares the 2 cores with the server"],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Submit to running for an urgent job that must preempt, over HTTP on an agent (issue 27).

    .venv/bin/python bench/urgent_latency.py [--rounds 20]   -> bench/results/urgent_latency.json
    .venv/bin/python bench/urgent_latency.py --tree DIR --label before   # another checkout

A real `onepool server` (API + broker loop) and a real `onepool agent` run as processes on
127.0.0.1 over a fresh SQLite home, with the broker's default settings (cycle_s 2 s, grace_s
60 s). Each round: a low-priority victim (examples/train_numpy.py, which checkpoints and exits
on SIGTERM) holds both GPUs of the only node; the bench POSTs an urgent job for both GPUs and
times from just before the POST to the moment the urgent job's command runs (it writes the
time as its first act: `date +%s.%N`, so Python's start-up of a training script is not
counted). Reported: p50, p95 and max seconds over the rounds, and the machine's load.

Assumptions (say what the number is about):
- the victim checkpoints on SIGTERM within its grace (train_numpy does, in ~0.1 s);
- the agent's node is idle apart from the victim; the machine is shared (load recorded);
- the client is the bench process itself (httpx), not a `onepool submit` process (timed by
  bench/cli_speed.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TREE = ROOT  # the source tree the server and agent run (--tree)

CONFIG = """
pools:
  - {name: onprem, provider: agent, gpu_type: A100, gpus_per_node: 2, nodes: 1, store_shared: true}
teams: [{name: research}, {name: prod, priority_allowance_gpus: 8}]
"""
TRAIN = [sys.executable, str(ROOT / "examples" / "train_numpy.py"), "--steps", "1000000", "--step-s",
         "0.05", "--ckpt-every", "20"]


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60.0, every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(every)


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    e["PYTHONPATH"] = str(TREE)
    e["ONEPOOL_RUN_AS"] = "root"  # as the tests do: ranks as this user (the venv's Python is root's)
    return e


def cli(home: Path, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "broker.client.cli", "--home", str(home), *args],
                       env=env(), cwd=TREE, capture_output=True, text=True, timeout=120)
    if p.returncode:
        raise SystemExit(f"onepool {' '.join(args)} failed: {p.stderr}")
    return p.stdout


def start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "broker.client.cli", *args], env=env(), cwd=TREE,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def one_round(http: httpx.Client, marks: Path, n: int) -> float:
    victim = http.post("/v1/jobs", json={"name": f"victim-{n}", "team": "research", "priority": "low",
                                         "gpus_per_node": 2, "command": TRAIN}).json()["id"]
    wait_for("the victim running", lambda: http.get(f"/v1/jobs/{victim}").json()["status"] == "RUNNING")
    time.sleep(0.3)  # the victim's Python is up and has its SIGTERM handler (not a wait for the broker)
    mark = marks / f"urgent-{n}"
    t0 = time.time()
    urgent = http.post("/v1/jobs", json={
        "name": f"urgent-{n}", "team": "prod", "priority": "urgent", "gpus_per_node": 2,
        "command": ["sh", "-c", f"date +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}; exec sleep 600"]})
    urgent.raise_for_status()
    try:
        wait_for("the urgent job running", mark.exists, timeout=60)
    except TimeoutError:
        uid = urgent.json()["id"]
        raise SystemExit(f"urgent: {http.get(f'/v1/jobs/{uid}').json()}\n"
                         f"victim: {http.get(f'/v1/jobs/{victim}').json()}") from None
    dt = float(mark.read_text()) - t0
    first = http.get(f"/v1/jobs/{victim}").json()["attempt_list"][0]
    if first["end_reason"] != "PREEMPTED":
        raise SystemExit(f"the victim was not preempted: {first}")
    for j in (urgent.json()["id"], victim):
        http.post(f"/v1/jobs/{j}/cancel")
    wait_for("both ended", lambda: all(http.get(f"/v1/jobs/{j}").json()["status"] in
                                       ("CANCELLED", "SUCCEEDED", "FAILED")
                                       for j in (urgent.json()["id"], victim)), timeout=120, every=0.05)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--label", default="", help="suffix of the result file, e.g. before")
    ap.add_argument("--tree", type=Path, default=ROOT, help="source tree to time (default: this one)")
    args = ap.parse_args()
    global TREE
    TREE = args.tree.resolve()
    sys.path.insert(0, str(TREE))
    from broker.client.demo_site import free_port

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home, marks = tmp / "home", tmp / "marks"
        marks.mkdir()
        (tmp / "onepool.yaml").write_text(CONFIG)
        cli(home, "apply", "-c", str(tmp / "onepool.yaml"))
        made = cli(home, "token", "create", "--team", "prod", "--role", "admin", "--json")
        token = json.loads(made)["token"]
        join = json.loads(cli(home, "node", "join-token", "onprem-0", "--json"))["join_token"]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        procs = [start(tmp / "server.log", "--home", str(home), "server", "--port", str(port))]
        (tmp / "join").write_text(join + "\n")
        (tmp / "join").chmod(0o600)
        try:
            http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

            def up() -> bool:
                try:
                    return bool(httpx.get(f"{url}/v1/healthz", timeout=1).json()["broker_up"])
                except httpx.HTTPError:
                    return False

            wait_for("the server", up, every=0.1)
            procs.append(start(tmp / "agent.log", "agent", "--server", url, "--join-token-file",
                               str(tmp / "join"), "--gpus", "2", "--gpu-type", "A100", "--state-dir",
                               str(tmp / "agent")))
            wait_for("the agent", lambda: http.get("/v1/nodes").json()[0]["state"] == "up", every=0.1)
            times = []
            for n in range(args.rounds):
                times.append(one_round(http, marks, n))
                print(f"round {n + 1}: {times[-1]:.3f} s", flush=True)
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
            from providers.local import LocalProcesses
            LocalProcesses(tmp / "agent" / "runs").kill_all()
    t = sorted(times)
    out = {"tree": "this checkout" if TREE == ROOT else f"another checkout ({TREE.name})",
           "rounds": len(t), "p50_s": round(statistics.median(t), 3),
           "p95_s": round(t[min(len(t) - 1, round(0.95 * (len(t) - 1)))], 3), "max_s": round(t[-1], 3),
           "all_s": [round(x, 3) for x in times], "goal": "p95 <= 0.5 s",
           "settings": "broker defaults (cycle_s 2 s); one agent node of 2 GPUs on 127.0.0.1",
           "cpus": os.cpu_count(), "load_average_1m_at_end": round(os.getloadavg()[0], 2),
           "assumptions": ["the victim checkpoints and exits on SIGTERM (examples/train_numpy.py)",
                           "'running' is the urgent command's first act (date), not a training step",
                           "the client is this process (httpx); CLI start-up: bench/cli_speed.py",
                           "ranks run as this user (ONEPOOL_RUN_AS=root when root, as the tests)"]}
    print(f"p50 {out['p50_s']:.3f} s  p95 {out['p95_s']:.3f} s  max {out['max_s']:.3f} s "
          f"(load {out['load_average_1m_at_end']})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"urgent_latency{'_' + args.label if args.label else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

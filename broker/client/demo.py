"""`onepool demo`: the whole story on this machine, with real processes, in under a minute.

Two local pools of different GPU types (2 nodes x 2 A100, 1 node x 4 L4). Four low-priority
training jobs fill all 8 GPUs. An urgent job needing the whole A100 pool (a 2-node gang)
arrives: the broker preempts the two A100 victims that lose the least work, they checkpoint
on SIGTERM and requeue keeping their place, the urgent job runs, the victims resume from
their checkpoints (step counter continuing), and everything finishes.

The A100 pool keeps its checkpoints in a SIMULATED S3 bucket (moto's server on 127.0.0.1,
see broker.client.demo_s3), the L4 pool in a local folder. The victims resume on the L4 pool once
it frees up, so the broker copies their newest checkpoint out of "S3", verifies it, and
charges them AWS's egress price for the bytes.

A fifth low-priority job finds every local GPU taken: after `cloud_after_wait_s` the broker
RENTS an AWS spot node for it (a g5.12xlarge in a SIMULATED EC2: the same moto server, real
boto3 calls: run_instances with a ClientToken, tags, spot market options), the job runs there
(as a local process: this machine stands in for the rented host, which is only the capacity
and billing object), and the idle node is terminated afterwards.

The broker runs as its own process (`onepool broker`), exactly as in production.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.client.demo_s3 import BUCKET, simulated_s3
from broker.client.sdk import FINAL, Client
from broker.errors import OnepoolError
from broker.state.store import home_dir

MARKER = ".demo-home"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"

DEMO_CONFIG: dict[str, Any] = {
    "pools": [
        {"name": "a100", "provider": "local", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 2,
         "price_per_node_hour": 8.0, "region": "us-east-1",
         "store": f"s3://{BUCKET}/checkpoints"},  # SIMULATED S3 (moto on 127.0.0.1)
        {"name": "l4", "provider": "local", "gpu_type": "L4", "gpus_per_node": 4, "nodes": 1,
         "price_per_node_hour": 3.2},
        # SIMULATED EC2 (moto on 127.0.0.1): price and interruption rate from pricing/data.
        {"name": "aws-spot", "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
         "max_nodes": 2, "market": "spot", "region": "us-east-1", "instance_type": "g5.12xlarge",
         "image": "ami-0demo0000000000", "launch_latency_s": 1, "idle_timeout_s": 2},
    ],
    "teams": [
        {"name": "research", "weight": 1.0, "priority_allowance_gpus": 0},
        {"name": "prod", "weight": 1.0, "priority_allowance_gpus": 4},
    ],
    "broker": {"cycle_s": 0.5, "grace_s": 10, "min_run_s": 20, "keep_checkpoints": 3,
               "checkpoint_delete_delay_s": 5, "cloud_after_wait_s": 2},
}


def prepare_home(home: str | os.PathLike[str] | None) -> Path:
    """A clean home for the demo. Refuses to wipe a home holding non-demo work."""
    h = home_dir(home)
    if (h / MARKER).exists():
        shutil.rmtree(h)
    elif (h / "onepool.db").exists():
        raise OnepoolError(f"{h} holds a broker that is not the demo's; run the demo elsewhere "
                           "with ONEPOOL_HOME=/some/empty/dir onepool demo")
    h.mkdir(parents=True, exist_ok=True)
    (h / MARKER).write_text("created by `onepool demo`; the next demo run wipes this folder\n")
    return h


def _train(steps: int) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--steps", str(steps), "--step-s", "0.25",
            "--ckpt-every", "4", "--state-kb", "1024"]


def run_demo(home: str | os.PathLike[str] | None, *, timeout: float = 180,
             progress: bool = True) -> dict[str, Any]:
    """Run the scenario and return {"home", "jobs": [...]} (see the module docstring)."""
    say = Console(stderr=True).print if progress else (lambda *a, **k: None)
    h = prepare_home(home)
    with simulated_s3() as endpoint:
        say(f"[bold]simulated[/bold] S3 bucket s3://{BUCKET} (moto server at {endpoint}; "
            "nothing leaves this machine)")
        out = _run(h, say, timeout)
    out["simulated_s3"] = {"bucket": f"s3://{BUCKET}", "endpoint": endpoint,
                           "note": "moto's S3 server on 127.0.0.1, started by the demo: simulated"}
    out["simulated_ec2"] = {"pool": "aws-spot", "endpoint": endpoint,
                            "note": "moto's EC2 on 127.0.0.1, started by the demo: simulated; "
                                    "jobs routed there ran as local processes"}
    return out


def _run(h: Path, say: Any, timeout: float) -> dict[str, Any]:
    c = Client(h)
    c.apply(_config())
    broker_log = open(h / "broker.log", "wb")  # noqa: SIM115  (closed in finally)
    proc = subprocess.Popen([sys.executable, "-m", "broker.client.cli", "--home", str(h), "broker"],
                            stdout=broker_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    say(f"[bold]onepool demo[/bold]: broker pid {proc.pid}, home {h}")
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        lows = [c.submit(name=f"sweep-{i}", team="research", experiment="lr-sweep",
                         command=_train(40), gpus_per_node=2, priority="low",
                         checkpoint_interval_s=1).id for i in range(5)]
        say("submitted 5 low-priority jobs (2 GPUs each): 4 fill both local pools, the 5th "
            "will rent simulated AWS spot")
        while not all(c.get(i).last_step is not None for i in lows[:4]):
            seen = _echo(c, seen, say)
            _check(proc, deadline)
            time.sleep(0.2)
        urgent = c.submit(name="hotfix-eval", team="prod", experiment="release",
                          command=_train(48), gpus_per_node=2, nodes=2, gpu_types=["A100"],
                          priority="urgent", budget_usd=5).id
        say("submitted an urgent 2-node job needing the whole A100 pool")
        ids = [*lows, urgent]
        while not all(c.get(i).status in FINAL for i in ids):
            seen = _echo(c, seen, say)
            _check(proc, deadline)
            time.sleep(0.2)
        while _instances_running() and time.monotonic() < deadline:  # idle spot nodes go back
            seen = _echo(c, seen, say)
            time.sleep(0.2)
        _echo(c, seen, say)
        left = len(_instances_running())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        broker_log.close()
    jobs = [c.get(i) for i in ids]
    market = {p.name: p.market.value for p in _config().pools}
    return {
        "home": str(h),
        "instances_left_running": left,
        "jobs": [{"id": j.id, "name": j.name, "priority": j.priority, "status": j.status,
                  "attempts": j.attempts, "preemptions": j.preemptions,
                  "wait_s": round(j.wait_s, 2), "gpu_s": round(j.gpu_s, 1),
                  "lost_gpu_s": round(j.lost_gpu_s, 2), "resumed_from_step": j.resumed_from_step,
                  "pool": j.attempt_list[-1].pool if j.attempt_list else None,
                  "market": market[j.attempt_list[-1].pool] if j.attempt_list else None,
                  "checkpoint_stores": j.checkpoint_stores, "egress_bytes": j.egress_bytes,
                  "egress_usd": round(j.egress_usd, 8)}
                 for j in jobs],
    }


def _config():  # type: ignore[no-untyped-def]
    from broker.spec import parse_config

    return parse_config(DEMO_CONFIG, "demo config")


def _instances_running() -> list[str]:
    """Instances pending/running in the simulated EC2 (AWS_ENDPOINT_URL_EC2 points at it)."""
    import boto3

    resp = boto3.client("ec2", region_name="us-east-1").describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i["InstanceId"] for r in resp["Reservations"] for i in r["Instances"]]


def _check(proc: subprocess.Popen[bytes], deadline: float) -> None:
    if proc.poll() is not None:
        raise OnepoolError(f"the demo broker exited with status {proc.returncode}; "
                           "see broker.log in the demo home")
    if time.monotonic() > deadline:
        raise TimeoutError("the demo did not finish in time; see `onepool status`")


def _echo(c: Client, seen: int, say: Any) -> int:
    evs = c.events()
    for e in evs[seen:]:
        if e.kind in ("started", "preempting", "preempted", "succeeded", "killed", "failed",
                      "checkpoint_copied", "node_launching", "node_terminated", "no_capacity"):
            who = f"job {e.job_id}" if e.job_id is not None else f"node {e.data.get('node', '?')}"
            say(f"  {who}: {e.kind:<10} {escape(e.message)}")
    return len(evs)


def render(result: dict[str, Any], console: Console) -> None:
    t = Table(title="onepool demo: every job, after the urgent one cut in")
    for col in ("job", "class", "status", "attempts", "preempted", "queue wait s", "GPU-s",
                "GPU-s lost", "resumed from step", "last pool", "market", "stores", "egress $"):
        t.add_column(col, justify="left" if col in ("job", "class", "status", "last pool", "market")
                     else "right")
    for j in result["jobs"]:
        t.add_row(escape(j["name"]), j["priority"], j["status"], str(j["attempts"]), str(j["preemptions"]),
                  f"{j['wait_s']:.1f}", f"{j['gpu_s']:.0f}", f"{j['lost_gpu_s']:.1f}",
                  "-" if j["resumed_from_step"] is None else str(j["resumed_from_step"]),
                  j["pool"] or "-", j["market"] or "-",
                  " -> ".join(u.split("://")[0] for u in j["checkpoint_stores"]),
                  f"{j['egress_usd']:.6f}")
    console.print(t)
    if "simulated_s3" in result:
        sim = result["simulated_s3"]
        console.print(f"{sim['bucket']} is SIMULATED: {sim['note']} ({sim['endpoint']}, gone now)")
    if "simulated_ec2" in result:
        console.print(f"pool {result['simulated_ec2']['pool']} is SIMULATED: "
                      f"{result['simulated_ec2']['note']}; instances left running: "
                      f"{result['instances_left_running']}")
    console.print(f"state kept in {result['home']} (try: onepool --home {result['home']} status)")

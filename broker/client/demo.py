"""`onepool demo`: the whole story on this machine, with real processes, in under two minutes.

The lab's set-up in miniature: `onepool server` (the HTTP API and the broker loop) runs as its
own process; two on-prem A100 hosts each run `onepool agent` (separate processes, joined with
one-time tokens); a local L4 pool is the server machine's own slots; and an AWS spot pool
rents instances in a SIMULATED EC2 (moto's server on 127.0.0.1), each of which "boots" its
user data on this machine (broker.client.demo_instances): the script starts the agent that joins
the server. The demo itself acts as the researchers: it submits through the API with
per-team tokens.

Five low-priority training jobs arrive: four fill the A100 hosts and the L4 pool, the fifth
waits `cloud_after_wait_s` and gets a rented spot node. An urgent job needing both A100
hosts (a 2-node gang) arrives: the broker preempts the two A100 victims that lose the least
work, the SIGTERM reaches them through their agents, they checkpoint and requeue keeping
their place, and resume from their checkpoints: one on the spot node's free GPUs, through
the other agent. Everything finishes; the idle spot node is given back.

The A100 pool keeps its checkpoints in a SIMULATED S3 bucket (moto again), the other pools in
a local folder, so a victim resuming elsewhere has its newest checkpoint copied out of "S3",
verified and charged AWS's egress price.

The jobs ship their code (issue 26): the researchers' project folder (`project/` in the demo's
home, holding examples/train_numpy.py) is packed and uploaded once per team, and every attempt
runs in a private copy of that snapshot, fetched from its pool's store by the node that runs it
(the agents run as if on hosts that never saw the folder: they are told only its digest).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.client.demo_s3 import BUCKET, simulated_s3
from broker.client.demo_site import DemoSite, free_port
from broker.client.http import HttpClient
from broker.client.sdk import FINAL
from broker.errors import OnepoolError
from broker.spec import ClusterConfig, parse_config
from broker.state.store import home_dir

MARKER = ".demo-home"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"

DEMO_CONFIG: dict[str, Any] = {
    "pools": [
        {"name": "a100", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 2,
         "price_per_node_hour": 8.0, "region": "us-east-1",
         "store": f"s3://{BUCKET}/checkpoints"},  # SIMULATED S3 (moto on 127.0.0.1)
        {"name": "l4", "provider": "local", "gpu_type": "L4", "gpus_per_node": 4, "nodes": 1,
         "price_per_node_hour": 3.2},
        # SIMULATED EC2 (moto on 127.0.0.1): price and interruption rate from pricing/data.
        {"name": "aws-spot", "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
         "max_nodes": 1, "market": "spot", "region": "us-east-1", "instance_type": "g5.12xlarge",
         "image": "ami-0demo0000000000", "launch_latency_s": 2, "idle_timeout_s": 2},
    ],
    "teams": [
        {"name": "research", "weight": 1.0, "priority_allowance_gpus": 0},
        {"name": "prod", "weight": 1.0, "priority_allowance_gpus": 4},
    ],
    "broker": {"cycle_s": 0.5, "grace_s": 10, "min_run_s": 20, "keep_checkpoints": 3,
               "checkpoint_delete_delay_s": 5, "cloud_after_wait_s": 2,
               "agent_heartbeat_s": 1, "node_lost_after_s": 15,
               # the leader's periodic duties, on the demo's one-minute scale
               "tasks": {"scale_down_s": 1, "enforce_budgets_s": 5, "retain_checkpoints_s": 5}},
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
    """The example trainer, run from the job's code snapshot (its working folder)."""
    return [sys.executable, EXAMPLE.name, "--steps", str(steps), "--step-s", "0.25",
            "--ckpt-every", "4", "--state-kb", "1024"]


def _project(h: Path) -> Path:
    """The researchers' project folder: what their jobs ship as their code."""
    proj = h / "project"
    proj.mkdir(exist_ok=True)
    shutil.copy2(EXAMPLE, proj / EXAMPLE.name)
    return proj


def run_demo(home: str | os.PathLike[str] | None, *, timeout: float = 180,
             progress: bool = True) -> dict[str, Any]:
    """Run the scenario and return {"home", "agents", "jobs": [...]} (see the module docstring)."""
    say = Console(stderr=True).print if progress else (lambda *a, **k: None)
    h = prepare_home(home)
    with simulated_s3() as endpoint:
        say(f"[bold]simulated[/bold] S3 bucket s3://{BUCKET} and EC2 (moto server at {endpoint}; "
            "nothing leaves this machine)")
        out = _run(h, say, timeout)
    out["simulated_s3"] = {"bucket": f"s3://{BUCKET}", "endpoint": endpoint,
                           "note": "moto's S3 server on 127.0.0.1, started by the demo: simulated"}
    out["simulated_ec2"] = {"pool": "aws-spot", "endpoint": endpoint,
                            "note": "moto's EC2 on 127.0.0.1, started by the demo: simulated; each "
                                    "instance's user data ran on this machine and started its agent"}
    return out


def _run(h: Path, say: Any, timeout: float) -> dict[str, Any]:
    port = free_port()
    cfg = _config(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout
    with DemoSite(h, cfg, port) as site:
        say(f"[bold]onepool demo[/bold]: server {site.url} (pid {site.procs['server'].pid}), "
            f"on-prem agents pids {', '.join(str(p.pid) for n, p in site.procs.items() if n != 'server')}"
            f", home {h}")
        research, prod, admin = site.client("research"), site.client("prod"), site.client("admin")
        seen = 0
        proj = _project(h)
        code = {team: c.upload_code(str(proj)) for team, c in (("research", research), ("prod", prod))}
        say(f"each team uploaded its project folder once as the code snapshot {code['research'][:19]}...: "
            "every attempt runs in a private copy of it, fetched by its node")

        def wait(cond: Any) -> None:
            nonlocal seen
            while not cond():
                seen = _echo(admin, seen, say)
                site.check()
                if time.monotonic() > deadline:
                    raise TimeoutError("the demo did not finish in time; see `onepool status`")
                time.sleep(0.5)  # the broker's cycle: polling faster only adds load

        # The first two (placed on the L4 pool, the cheapest) run long, so the L4 pool is still
        # busy when the urgent job's victims requeue: one resumes on the spot node. The next two
        # (the A100 hosts: the victims) run as long, so they are still running when the urgent
        # job comes, even on a busy machine where the spot node takes a while to boot.
        lows = [research.submit(name=f"sweep-{i}", experiment="lr-sweep",
                                command=_train(100 if i < 4 else 40), gpus_per_node=2,
                                priority="low", checkpoint_interval_s=1, code=code["research"]).id
                for i in range(5)]
        say("team research submitted 5 low-priority jobs (2 GPUs each) over the API: 4 fill the "
            "A100 hosts and the L4 pool, the 5th rents simulated AWS spot")

        def by_id() -> dict[int, Any]:  # one request per poll for every job
            return {j.id: j for j in admin.list()}

        wait(lambda: (js := by_id()) and all(js[i].last_step is not None for i in lows[:4])
             and js[lows[4]].status == "RUNNING")
        urgent = prod.submit(name="hotfix-eval", experiment="release", command=_train(48),
                             gpus_per_node=2, nodes=2, gpu_types=["A100"], priority="urgent",
                             budget_usd=5, code=code["prod"]).id
        say("team prod submitted an urgent 2-node job needing both A100 hosts")
        ids = [*lows, urgent]
        wait(lambda: (js := by_id()) and all(js[i].status in FINAL for i in ids))
        with contextlib.suppress(TimeoutError):  # idle spot nodes go back
            wait(lambda: not _instances_running())
        _echo(admin, seen, say)
        left = len(_instances_running())
        agents = site.agents()
        jobs = [admin.get(i) for i in ids]
    pid_of = {a["node"]: a["pid"] for a in agents}
    market = {p.name: p.market.value for p in cfg.pools}
    return {
        "home": str(h),
        "server": site.url,
        "code": code["research"],
        "instances_left_running": left,
        "agents": agents,
        "jobs": [{"id": j.id, "name": j.name, "priority": j.priority, "status": j.status,
                  "attempts": j.attempts, "preemptions": j.preemptions,
                  "wait_s": round(j.wait_s, 2), "gpu_s": round(j.gpu_s, 1),
                  "lost_gpu_s": round(j.lost_gpu_s, 2), "resumed_from_step": j.resumed_from_step,
                  "pool": j.attempt_list[-1].pool if j.attempt_list else None,
                  "market": market[j.attempt_list[-1].pool] if j.attempt_list else None,
                  "attempt_list": [{"node": a.alloc[0][0], "agent_pid": pid_of.get(a.alloc[0][0]),
                                    "end_reason": a.end_reason} for a in j.attempt_list],
                  "checkpoint_stores": j.checkpoint_stores, "egress_bytes": j.egress_bytes,
                  "egress_usd": round(j.egress_usd, 8)}
                 for j in jobs],
    }


def _config(server_url: str = "http://127.0.0.1:8421") -> ClusterConfig:
    data = {**DEMO_CONFIG, "broker": {**DEMO_CONFIG["broker"], "server_url": server_url}}
    return parse_config(data, "demo config")


def _instances_running() -> list[str]:
    """Instances pending/running in the simulated EC2 (AWS_ENDPOINT_URL_EC2 points at it)."""
    import boto3

    resp = boto3.client("ec2", region_name="us-east-1").describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i["InstanceId"] for r in resp["Reservations"] for i in r["Instances"]]


def _echo(c: HttpClient, seen: int, say: Any) -> int:
    evs = c.events()
    for e in evs[seen:]:
        if e.kind in ("started", "preempting", "preempted", "succeeded", "killed", "failed",
                      "checkpoint_copied", "node_launching", "node_terminated", "no_capacity",
                      "agent_joined"):
            who = f"job {e.job_id}" if e.job_id is not None else f"node {e.data.get('node', '?')}"
            say(f"  {who}: {e.kind:<13} {escape(e.message)}")
    return len(evs)


def render(result: dict[str, Any], console: Console) -> None:
    t = Table(title="onepool demo: every job, after the urgent one cut in")
    for col in ("job", "class", "status", "attempts", "preempted", "queue wait s", "GPU-s",
                "GPU-s lost", "resumed from step", "ran on (agent pid)", "market", "stores", "egress $"):
        t.add_column(col, justify="left" if col in ("job", "class", "status", "ran on (agent pid)",
                                                    "market") else "right")
    for j in result["jobs"]:
        where = " -> ".join(a["node"] + (f" ({a['agent_pid']})" if a["agent_pid"] else " (local)")
                            for a in j["attempt_list"])
        t.add_row(escape(j["name"]), j["priority"], j["status"], str(j["attempts"]), str(j["preemptions"]),
                  f"{j['wait_s']:.1f}", f"{j['gpu_s']:.0f}", f"{j['lost_gpu_s']:.1f}",
                  "-" if j["resumed_from_step"] is None else str(j["resumed_from_step"]),
                  escape(where) or "-", j["market"] or "-",
                  " -> ".join(u.split("://")[0] for u in j["checkpoint_stores"]),
                  f"{j['egress_usd']:.6f}")
    console.print(t)
    a = Table(title=f"agents that joined the server at {result.get('server', '?')}")
    for col in ("node", "pool", "market", "agent pid", "started by"):
        a.add_column(col)
    for ag in result.get("agents", []):
        a.add_row(ag["node"], ag["pool"], ag["market"], str(ag["pid"]),
                  "the instance's user data" if ag["booted_from_user_data"] else "onepool agent (on-prem)")
    console.print(a)
    if "simulated_s3" in result:
        sim = result["simulated_s3"]
        console.print(f"{sim['bucket']} is SIMULATED: {sim['note']} ({sim['endpoint']}, gone now)")
    if "simulated_ec2" in result:
        console.print(f"pool {result['simulated_ec2']['pool']} is SIMULATED: "
                      f"{result['simulated_ec2']['note']}; instances left running: "
                      f"{result['instances_left_running']}")
    console.print(f"state kept in {result['home']} (try: onepool --home {result['home']} status)")

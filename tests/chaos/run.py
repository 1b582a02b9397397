"""The chaos suite: a real workload under a storm of kills and cloud faults, then the count.

    make chaos                                  # CHAOS_KILLS=100
    CHAOS_KILLS=20 CHAOS_SEED=7 CHAOS_DB=postgresql make chaos

What runs is production's shape (infra/README.md): `onepool server` processes (API + broker
loop; a second one on the same database is the standby) on one database (SQLite in a
temporary home, or CHAOS_DB=postgresql: a throwaway server from tests/postgres.py), behind
one address, `broker.server_url` (tests/chaos/balancer.py, the load balancer in front of an
HA pair). Pools: an on-prem pool with `provider: agent` (two hosts, each an `onepool agent`
process started by the suite), a local pool (slots of the leader's host), and two AWS spot
pools on moto's server (EC2 + SQS through tests/chaos/proxy.py, checkpoints in moto's S3, so
resumes copy across stores) whose instances boot their user data on this machine
(broker.client.demo_instances.InstanceBooter): the agent it starts joins through the
balancer, and a rented node is up only once it has. Every job is examples/train_numpy.py
under tests/chaos/witness.py (an exclusive lock per job and rank: a second live process of
the same job is caught in the act) and appends a line to a done-file when it finishes.

What is done to it, at random (CHAOS_SEED), until CHAOS_KILLS kills have happened:
- the leader server SIGKILLed from outside at a random moment;
- a broker that arms a crash point (broker/crashpoints.py) SIGKILLs itself there: a launch
  in flight, a database write in flight (fenced, not committed), a preemption's grace, a
  checkpoint copy, a cloud launch whose answer is not written, a notice recorded but not
  acknowledged;
- a job's supervisor (providers.local_runner, on the leader's host or under an agent)
  SIGKILLed, its job left running;
- a node agent SIGKILLed: an on-prem one starts again soon (it adopts its ranks) or after
  its node was declared lost (its ranks fenced themselves, the work requeued); a rented
  instance's agent stays dead (its node is lost, the instance terminated);
- a second server started now and then (it stands by); the leader paused (SIGSTOP) past its
  lease so the standby takes over, then woken (SIGCONT) as a stale leader;
- cloud faults: no capacity on the cheapest pool, throttling bursts, timeouts (the call
  still reaches the cloud), 5xx, a listing that misses a live instance, spot interruption
  notices followed by the reclaim, a reclaim whose notice was lost;
- urgent jobs that preempt, and more jobs.
Kills count the SIGKILLs of servers (from outside and at crash points), supervisors and
agents. Fault kinds are entries of FAULTS (tests/chaos/faults.py).

Then the faults stop, the dead agents start again, one server runs until every job has
finished and every rented node is given back, and the suite counts. Its last line is one JSON object:
{"kills", "jobs", "completed_once", "lost_jobs", "duplicate_completions",
 "concurrent_duplicate_attempts", "leaked_instances", "stuck_jobs"}; a table before it says
what was injected. Exit status 0 only if every job completed once, the rest is zero, no
server or agent exited with an error and no job process is left.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.chaos.balancer import Balancer
from tests.chaos.nodes import Hosts, processes_under, rented_agents

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_numpy.py"
WITNESS = Path(__file__).with_name("witness.py")
BUCKET = "chaos"
REGION = "us-east-1"
CHEAP, DEAR = "g5.12xlarge", "g6.12xlarge"
LEASE_S = 3.0
NODE_LOST_S, HEARTBEAT_S = 12.0, 2.0  # the broker's agent timing (defaults 30 s and 5 s)
DRAIN_S = 900.0
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
SHAPES = [  # (weight, GPUs per node, nodes, acceptable GPU types) of the random jobs
    (30, 1, 1, []), (20, 2, 1, []), (20, 1, 1, ["A100"]), (10, 4, 1, ["A10G"]),
    (10, 2, 2, ["A100"]), (10, 4, 1, [])]


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def chaos_config(proxy_url: str, queue_url: str, server_url: str) -> dict[str, Any]:
    aws = {"provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0, "max_nodes": 2,
           "market": "spot", "region": REGION, "image": "ami-0chaos000000000", "launch_latency_s": 0,
           "idle_timeout_s": 3, "interruption_rate_per_h": 0.01, "endpoint_url": proxy_url,
           "store": f"s3://{BUCKET}/ckpt",
           "options": {"queue_url": queue_url, "read_timeout_s": 2, "connect_timeout_s": 2}}
    return {
        "pools": [
            {"name": "a100", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 2,
             "price_per_node_hour": 8.0},
            {"name": "l4", "gpu_type": "L4", "gpus_per_node": 4, "nodes": 1, "price_per_node_hour": 3.0},
            {**aws, "name": "cheap", "instance_type": CHEAP, "price_per_node_hour": 1.0},
            {**aws, "name": "dear", "instance_type": DEAR, "price_per_node_hour": 3.0},
        ],
        "teams": [{"name": "research", "priority_allowance_gpus": 4},
                  {"name": "prod", "priority_allowance_gpus": 8}],
        "broker": {"cycle_s": 0.3, "grace_s": 3, "min_run_s": 5, "lease_s": LEASE_S,
                   "cloud_after_wait_s": 1, "keep_checkpoints": 2,
                   "tasks": {"sweep_orphans_s": 10, "scale_down_s": 1, "retain_checkpoints_s": 5},
                   "checkpoint_delete_delay_s": 5, "server_url": server_url,
                   "node_lost_after_s": NODE_LOST_S, "agent_heartbeat_s": HEARTBEAT_S},
    }


@dataclass
class Broker:
    """One `onepool server` process (API + broker loop) on its own port."""

    proc: subprocess.Popen[bytes]
    crash_at: str | None
    log: Path
    port: int
    killed_by_us: bool = False
    paused: bool = False


@dataclass
class Chaos:
    """The running experiment: its home, clouds, servers, agents and counters."""

    rng: random.Random
    home: Path
    env: dict[str, str]
    client: Any
    faults: Any
    ec2: Any
    sqs: Any
    queue: str
    balancer: Balancer
    hosts: Hosts
    booter: Any = None
    brokers: list[Broker] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    broker_errors: list[str] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    started: int = 0

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    # -- servers (API + broker loop) --------------------------------------------------------
    def start_broker(self, crash_at: str | None = None) -> Broker:
        from broker.client.demo_site import free_port

        self.started += 1
        env = dict(self.env)
        if crash_at:
            env["ONEPOOL_CRASH_AT"] = crash_at
        log = self.home / f"server-{self.started:03d}.log"
        port = free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "broker.client.cli", "--home", str(self.home),
                                     "server", "--port", str(port)], cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        b = Broker(proc, crash_at, log, port)
        self.brokers.append(b)
        self.route()
        return b

    def route(self) -> None:
        """The balancer's health check: live servers that are not paused."""
        self.balancer.set_backends([b.port for b in self.brokers if b.proc.poll() is None and not b.paused])

    def reap(self) -> None:
        """Forget brokers that died; count the ones that died at a crash point."""
        for b in list(self.brokers):
            rc = b.proc.poll()
            if rc is None:
                continue
            self.brokers.remove(b)
            if rc == -signal.SIGKILL and not b.killed_by_us:
                where = re.findall(r"crash point (\w+)", b.log.read_text(errors="replace"))
                self.kills[f"broker at crash point {where[-1] if where else '?'}"] += 1
            elif rc not in (0, -signal.SIGKILL, -signal.SIGTERM):
                tail = b.log.read_text(errors="replace")[-2000:]
                self.broker_errors.append(f"server {b.proc.pid} exited {rc}: {tail}")
                say(f"server {b.proc.pid} exited with status {rc}; see {b.log}")
        self.route()
        for err in self.hosts.died():
            self.broker_errors.append(err)
            say(err.splitlines()[0])

    def leader(self) -> Broker | None:
        from broker.control.lease import lease_row

        holder = lease_row(self.client.store).holder or ""
        parts = holder.split(":")
        pid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
        return next((b for b in self.brokers if b.proc.pid == pid and b.proc.poll() is None), None)

    def kill(self, b: Broker, what: str) -> None:
        b.killed_by_us = True
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        self.kills[what] += 1
        self.route()

    def ensure_broker(self) -> None:
        self.reap()
        if not self.brokers:
            self.start_broker(self.arm())

    def arm(self) -> str | None:
        """Most brokers carry two or three armed crash points (the others die from outside)."""
        if self.rng.random() < 0.2:
            return None
        points = ["launch:0.3", "db_write:0.02", "preempt_grace:0.5", "checkpoint_copy:0.5",
                  "cloud_launch:0.5", "notice:0.5"]
        return ",".join(self.rng.sample(points, self.rng.randint(2, 3)))

    # -- jobs --------------------------------------------------------------------------------
    def submit(self, n: int = 1, priority: str | None = None) -> None:
        """Random jobs; urgent ones want the on-prem A100s (so they preempt)."""
        for _ in range(n):
            r = self.rng
            gpus, nodes, types = (2, 1, ["A100"]) if priority == "urgent" else r.choices(
                [shape for _, *shape in SHAPES], [w for w, *_ in SHAPES])[0]
            prio = priority or r.choices(["low", "normal", "high"], [5, 3, 1])[0]
            cmd = [sys.executable, str(WITNESS), str(self.home / "locks"),
                   str(self.home / "violations.jsonl"), "--",
                   sys.executable, str(TRAIN), "--steps", str(r.randint(20, 60)), "--step-s", "0.1",
                   "--ckpt-every", "5", "--state-kb", "64", "--done-file", str(self.home / "done.jsonl")]
            info = self.client.submit(name=f"c{len(self.jobs)}", team=r.choice(["research", "prod"]),
                                      command=cmd, gpus_per_node=gpus, nodes=nodes, gpu_types=types,
                                      priority=prio, checkpoint_interval_s=1)
            self.jobs.append(info.id)

    def supervisors(self) -> list[psutil.Process]:
        """Rank supervisors, on the leader's host and under agents (on-prem and rented)."""
        return processes_under(self.home, "providers.local_runner")

    def runs(self) -> list[Path]:
        """Every folder of rank folders: the local slots', the hosts' and the instances'."""
        return [self.home / "runs", *self.hosts.runs(), *self.home.glob("instances/*/agent/runs")]

    def instances(self, states: tuple[str, ...] = ("pending", "running")) -> list[dict[str, Any]]:
        resp = self.ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": list(states)}])
        return [i for r in resp["Reservations"] for i in r["Instances"]]


def main() -> int:
    target = int(os.environ.get("CHAOS_KILLS", "100"))
    seed = int(os.environ.get("CHAOS_SEED") or time.time_ns() % 100_000)
    backend = os.environ.get("CHAOS_DB", "sqlite")
    t0 = time.monotonic()
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    home = Path(tempfile.mkdtemp(prefix="onepool-chaos-"))
    pg = None
    say(f"seed {seed}, {target} kills, database {backend}, home {home}")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log

    from tests.agents.harness import FakeImds
    from tests.chaos.proxy import FaultProxy, Faults

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    faults = Faults()
    proxy = FaultProxy((host, port), faults)
    balancer = Balancer()
    imds = FakeImds()  # what the instances' agents watch for notices (none: those come by SQS)
    chaos: Chaos | None = None
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ONEPOOL_"))}
        env.update({"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos",
                    "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
                    "ONEPOOL_PROVIDER_RETRY_MAX_S": "0.5", "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
                    "PYTHONPATH": str(ROOT),
                    # jobs get a clean environment: the store's emulator and this checkout reach them
                    "ONEPOOL_PASS_ENV": "PYTHONPATH,AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,"
                                        "AWS_DEFAULT_REGION,AWS_ENDPOINT_URL_S3",
                    **({"ONEPOOL_RUN_AS": "root"} if os.geteuid() == 0 else {})})
        if backend == "postgresql":
            from tests.postgres import PgServer

            pg = PgServer.start()
            env["ONEPOOL_DATABASE_URL"] = pg.create_database("chaos")
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AWS_", "ONEPOOL_"))})
        os.environ["PYTHONPATH"] = str(ROOT)  # the instances' agents run this checkout
        chaos = setup(home, env, faults, seed, f"http://{host}:{port}", proxy.url, balancer, imds.url)
        storm(chaos, target)
        drain(chaos)
        result, table, clean = verify(chaos, time.monotonic() - t0, seed, backend)
    finally:
        cleanup(chaos, home)
        balancer.stop()
        imds.close()
        proxy.stop()
        moto.stop()
        if pg is not None:
            pg.stop()
    print(table, flush=True)
    print(json.dumps(result), flush=True)
    ok = (clean and result["completed_once"] == result["jobs"]
          and all(result[k] == 0 for k in ("lost_jobs", "duplicate_completions",
                                            "concurrent_duplicate_attempts", "leaked_instances",
                                            "stuck_jobs")))
    if ok:
        shutil.rmtree(home, ignore_errors=True)
    else:
        say(f"kept {home} for inspection")
    return 0 if ok else 1


def setup(home: Path, env: dict[str, str], faults: Any, seed: int, moto_url: str, proxy_url: str,
          balancer: Balancer, imds_url: str) -> Chaos:
    import boto3

    from broker.client.demo_instances import Ec2Instances, InstanceBooter
    from broker.client.sdk import Client
    from broker.control.capacity_manager import broker_id
    from broker.spec import parse_config

    (home / "locks").mkdir()
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    sqs = boto3.client("sqs", endpoint_url=moto_url, region_name=REGION)
    queue = sqs.create_queue(QueueName="chaos-notices", Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
    ec2 = boto3.client("ec2", endpoint_url=moto_url, region_name=REGION)
    client = Client(home)
    config = parse_config(chaos_config(proxy_url, queue, balancer.url), "chaos config")
    client.apply(config)
    hosts = Hosts(client, balancer.url, home)
    for n in client.nodes():
        pool = config.pool(n.pool)
        if pool.provider == "agent":
            hosts.add(n.id, pool.gpus_per_node, pool.gpu_type)
    chaos = Chaos(random.Random(seed), home, env, client, faults, ec2, sqs, queue, balancer, hosts)
    with client.store.session() as s:
        bid = broker_id(s)
    # The cloud side: moto's instances boot their user data here (the booter reads moto
    # directly, as the cloud itself would, not through the fault proxy).
    booter_ec2 = boto3.client("ec2", endpoint_url=moto_url, region_name=REGION)
    chaos.booter = InstanceBooter(Ec2Instances(lambda: booter_ec2, broker_id=bid), home / "instances",
                                  metadata_url=lambda iid: imds_url).__enter__()
    chaos.submit(30)
    return chaos


def storm(c: Chaos, target: int) -> None:
    """Inject faults until `target` kills have happened."""
    from tests.chaos.faults import FAULTS

    c.start_broker(None)
    c.hosts.start_all()
    names = list(FAULTS)
    weights = [FAULTS[n][0] for n in names]
    last = 0
    while c.total_kills < target:
        c.ensure_broker()
        c.hosts.tend()
        name = c.rng.choices(names, weights)[0]
        if FAULTS[name][1](c):
            c.actions[name] += 1
        time.sleep(c.rng.uniform(0.3, 1.2))
        c.reap()
        if c.total_kills // 10 > last:
            last = c.total_kills // 10
            done = sum(i.status in FINAL for i in c.client.list())
            say(f"{c.total_kills}/{target} kills; jobs finished {done}/{len(c.jobs)}; "
                f"servers {len(c.brokers)}; agents up {len(c.hosts.live())}/{len(c.hosts.hosts)} on-prem, "
                f"{len(rented_agents(c.booter))} rented; faults {dict(c.faults.injected)}")


def drain(c: Chaos) -> None:
    """Faults off, the dead agents back; one unarmed server finishes the work and gives every
    rented node back."""
    c.faults.clear()
    c.reap()
    for b in list(c.brokers):
        if b.proc.poll() is None:
            b.proc.send_signal(signal.SIGCONT)  # a paused one wakes up
            b.proc.send_signal(signal.SIGTERM)
            b.proc.wait(timeout=60)
    c.reap()
    c.hosts.start_all()
    final = c.start_broker(None)
    say(f"storm over after {c.total_kills} kills; draining {len(c.jobs)} jobs")
    deadline = time.monotonic() + DRAIN_S
    last = time.monotonic()
    while time.monotonic() < deadline:
        infos = c.client.list()
        if all(i.status in FINAL for i in infos) and not c.instances() and _rented_alive(c) == 0:
            break
        if final.proc.poll() is not None:  # it must not die now: report and restart
            c.reap()
            final = c.start_broker(None)
        c.reap()
        c.hosts.start_all()
        if time.monotonic() - last > 30:
            last = time.monotonic()
            waiting = Counter(i.status for i in infos)
            say(f"draining: {dict(waiting)}; instances {len(c.instances())}; rented nodes {_rented_alive(c)}")
        time.sleep(1.0)
    final.proc.send_signal(signal.SIGTERM)
    final.proc.wait(timeout=60)
    c.reap()
    c.hosts.stop_all()


def _rented_alive(c: Chaos) -> int:
    from sqlmodel import col, select

    from broker.state.model import Node

    with c.client.store.session() as s:
        return len(s.exec(select(Node.id).where(col(Node.pool).in_(["cheap", "dear"]),
                                                col(Node.state) != "terminated")).all())


def verify(c: Chaos, wall_s: float, seed: int, backend: str) -> tuple[dict[str, int], str, bool]:
    """The count (the JSON), the table, and whether nothing else went wrong (no server or
    agent exited with an error, no job process left)."""
    infos = {i.id: i for i in c.client.list()}
    done_file, violations = c.home / "done.jsonl", c.home / "violations.jsonl"
    lines = [json.loads(x) for x in done_file.read_text().splitlines()] if done_file.exists() else []
    per_rank = Counter((int(x["job"]), x["rank"]) for x in lines)  # completions of each rank
    done = Counter({j: max(n for (jj, _), n in per_rank.items() if jj == j) for j, _ in per_rank})
    dup = violations.read_text().splitlines() if violations.exists() else []
    completed_attempts = {j: sum(a.end_reason == "COMPLETED" for a in i.attempt_list)
                          for j, i in infos.items()}
    result = {
        "kills": c.total_kills,
        "jobs": len(c.jobs),
        "completed_once": sum(1 for j in c.jobs if j in infos and infos[j].status == "SUCCEEDED"
                              and done[j] == 1 and completed_attempts[j] == 1),
        "lost_jobs": sum(1 for j in c.jobs if j not in infos or infos[j].status in ("FAILED", "CANCELLED")),
        "duplicate_completions": sum(1 for j in c.jobs if done[j] > 1 or completed_attempts.get(j, 0) > 1),
        "concurrent_duplicate_attempts": len(dup),
        "leaked_instances": len(c.instances(("pending", "running", "stopping", "stopped"))),
        "stuck_jobs": sum(1 for j in c.jobs if j in infos and infos[j].status not in FINAL),
    }
    attempts = sum(len(i.attempt_list) for i in infos.values())
    causes = Counter(a.cause or "completed" for i in infos.values() for a in i.attempt_list)
    leftovers = processes_under(c.home, "providers.local_runner", str(WITNESS), str(TRAIN))
    pools = Counter(a.pool for i in infos.values() for a in i.attempt_list)
    from broker.control.lease import lease_row

    rows = [
        ("wall time", f"{wall_s:.0f} s"), ("seed / database", f"{seed} / {backend}"),
        ("kills", ", ".join(f"{k} {v}" for k, v in sorted(c.kills.items()))),
        ("other actions", ", ".join(f"{k} {v}" for k, v in sorted(c.actions.items()))),
        ("cloud faults injected", ", ".join(f"{k} {v}" for k, v in sorted(c.faults.injected.items()))),
        ("server processes", f"{c.started} started; leadership changed hands "
                             f"{lease_row(c.client.store).fencing} times"),
        ("agents", f"on-prem restarted {c.hosts.restarts} times; {len(c.booter.history)} instances booted"),
        ("exits with an error", str(len(c.broker_errors))),
        ("jobs / attempts", f"{len(c.jobs)} / {attempts}"),
        ("attempts per pool", ", ".join(f"{k} {v}" for k, v in sorted(pools.items()))),
        ("attempt endings", ", ".join(f"{k} {v}" for k, v in causes.most_common())),
        ("job processes left", str(len(leftovers))),
        ("tracebacks logged", ", ".join(f"{k} {v}" for k, v in tracebacks(c.home).most_common()) or "none"),
    ]
    width = max(len(k) for k in [*(k for k, _ in rows), *result])
    table = "\n".join(f"{k:<{width}}  {v}" for k, v in rows) + "\n\n" + "\n".join(
        f"{k:<{width}}  {v}" for k, v in result.items())
    for err in c.broker_errors:
        say(err)
    return result, table, not c.broker_errors and not leftovers


def tracebacks(home: Path) -> Counter[str]:
    """Failures the servers and agents contained and logged: the log line before each
    traceback, without its timestamp (each one is a bug to look at, even when contained)."""
    out: Counter[str] = Counter()
    for log in [*home.glob("server-*.log"), *home.glob("hosts/*.log"), *home.glob("instances/*/console.log")]:
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Traceback") and i > 0 and lines[i - 1].strip():  # not a chained one
                out[re.sub(r"^[\d-]+ [\d:,]+ ", "", lines[i - 1])[:100]] += 1
    return out


def cleanup(c: Chaos | None, home: Path) -> None:
    """No server, agent, instance, job process or cgroup outlives the suite."""
    from tests.conftest import kill_leftovers

    if c is not None:
        for b in c.brokers:
            if b.proc.poll() is None:
                b.proc.send_signal(signal.SIGCONT)
                b.proc.kill()
                b.proc.wait()
        c.hosts.stop_all()
        if c.booter is not None:
            c.booter.__exit__(None, None, None)
        for runs in c.runs():
            kill_leftovers(runs)
    elif (home / "runs").exists():
        kill_leftovers(home / "runs")

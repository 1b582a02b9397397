"""Rented instances (moto's EC2) whose user data is executed as the instance would: the agent
it starts joins, watches a fake metadata service for spot notices, and dies with the
instance. The broker's engine is driven by the test on an injected clock."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from broker.client.demo_instances import Ec2Instances, InstanceBooter
from tests.agents.harness import FakeImds, Site, alive, make_site, wait_for
from tests.conftest import drive, kill_leftovers, train

pytestmark = pytest.mark.e2e
AMI = "ami-12345678"
SPOT = {"name": "spot", "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
        "max_nodes": 2, "market": "spot", "region": "us-east-1", "instance_type": "g5.12xlarge",
        "image": AMI, "price_per_node_hour": 2.0, "launch_latency_s": 0, "idle_timeout_s": 0,
        "interruption_rate_per_h": 0.01}


@pytest.fixture
def imds() -> Iterator[dict[str, FakeImds]]:
    """One fake metadata service per instance, made when the instance boots."""
    made: dict[str, FakeImds] = {}
    yield made
    for m in made.values():
        m.close()


@pytest.fixture
def cloud(tmp_path: Path, clock, aws_mock, imds) -> Iterator[tuple[Site, InstanceBooter]]:  # type: ignore[no-untyped-def]
    site = make_site(tmp_path / "home", clock, pools=[SPOT], cloud_after_wait_s=0,
                     node_lost_after_s=6, agent_heartbeat_s=1, grace_s=20)
    ec2 = boto3.client("ec2", region_name="us-east-1")

    def url(iid: str) -> str:
        imds.setdefault(iid, FakeImds())
        return imds[iid].url

    with InstanceBooter(Ec2Instances(lambda: ec2), tmp_path / "instances", metadata_url=url) as booter:
        yield site, booter
        _finish(site)
    site.close()
    kill_leftovers(tmp_path / "home" / "runs")


def _finish(site: Site) -> None:
    """Cancel what is left and let the idle instances go back."""
    c = site.client
    for j in c.list(status=["PENDING", "RUNNING"]):
        c.cancel(j.id)
    drive(site.engine, lambda: not c.list(status=["PENDING", "RUNNING"])
          and all(n.state in ("terminated",) for n in _rented(site)), timeout=60)


def _rented(site: Site) -> list[Any]:
    from sqlmodel import select

    from broker.state.model import Node

    with site.client.store.session() as s:
        return list(s.exec(select(Node).where(Node.pool == "spot")).all())


def _instance_of(site: Site, job: int) -> str:
    node = site.client.get(job).attempt_list[-1].alloc[0][0]
    return next(n.instance_id for n in _rented(site) if n.id == node)


def test_a_spot_notice_from_the_metadata_service_checkpoints_and_requeues_within_the_window(cloud, imds):
    site, _ = cloud
    c = site.client
    j = c.submit(name="sweep", team="research", command=train(300, step_s=0.05, ckpt_every=50),
                 gpus_per_node=2, priority="low", checkpoint_interval_s=3600).id
    drive(site.engine, lambda: (c.get(j).last_step or -1) >= 0, timeout=60)
    first_node = c.get(j).attempt_list[0].alloc[0][0]
    iid = _instance_of(site, j)
    wait_for("agent watches IMDS", lambda: iid in imds and imds[iid].tokens_asked > 0)
    notice_at = time.monotonic()
    imds[iid].arm()
    drive(site.engine, lambda: c.get(j).attempts >= 2, timeout=60)
    requeued_in = time.monotonic() - notice_at
    first = c.get(j).attempt_list[0]
    assert first.end_reason == "INTERRUPTED" and first.cause == "spot_interruption"
    assert requeued_in < 120  # AWS gives two minutes
    drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=90)
    second = c.get(j).attempt_list[1]
    assert second.alloc[0][0] != first_node  # the interrupted node takes no new work
    assert second.restored_step == first.reached_step  # the checkpoint it took on the notice
    kinds = [e.kind for e in c.events()]
    assert {"interruption_notice", "checkpoint_requested", "interrupting"} <= set(kinds)


def test_a_killed_agent_loses_its_node_the_instance_is_terminated_and_the_job_resumes_once(
        cloud, clock, aws_mock):
    site, booter = cloud
    c = site.client
    j = c.submit(name="train", team="research", command=train(120, step_s=0.05, ckpt_every=4),
                 gpus_per_node=2, priority="low").id
    drive(site.engine, lambda: (c.get(j).last_step or -1) >= 4, timeout=60)
    iid = _instance_of(site, j)
    b = booter.booted[iid]
    pid = json.loads(next((b.home / "agent" / "runs").glob("attempt-*/rank-0/handle.json"))
                     .read_text())["pid"]
    booter.kill_agent(iid)
    clock.advance(7)  # past node_lost_after_s on the broker's clock
    drive(site.engine, lambda: c.get(j).attempts >= 2, timeout=60)
    state = boto3.client("ec2", region_name="us-east-1").describe_instances(InstanceIds=[iid])
    assert state["Reservations"][0]["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")
    wait_for("the instance's rank died with it", lambda: not alive(pid), timeout=20)
    drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=90)
    info = c.get(j)
    assert [a.end_reason for a in info.attempt_list] == ["LOST", "COMPLETED"]
    assert info.attempt_list[1].restored_step is not None
    assert _instance_of(site, j) != iid
    assert [n.end_reason for n in _rented(site) if n.instance_id == iid] == ["agent_lost"]

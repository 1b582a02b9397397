"""The engine renting AWS spot capacity (moto in-process), with real job processes.

Each instance the broker launches boots its user data on this machine (InstanceBooter): the
agent it starts joins the test's API server and runs the ranks placed there. Every test ends
with no instance running in moto (tests/conftest.py checks it)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from sqlmodel import select

from broker.control.engine import Engine
from broker.state.model import Attempt, Node, NodeState
from providers.aws import AwsProvider
from providers.base import TAG_BROKER, TAG_NODE, TAG_POOL
from tests.conftest import drive, train
from tests.providers.harness import failing

# SQLite only, but for the tests marked both_dbs (transactions they depend on): see tests/conftest.py

AMI = "ami-12345678"


def spot_pool(name: str = "spot", price: float = 2.0, **kw: Any) -> dict[str, Any]:
    return {"name": name, "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
            "max_nodes": 2, "market": "spot", "region": "us-east-1", "instance_type": "g5.12xlarge",
            "image": AMI, "price_per_node_hour": price, "launch_latency_s": 0, "idle_timeout_s": 0,
            "interruption_rate_per_h": 0.01, **kw}


ONPREM = {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}


def running_instances() -> list[dict[str, Any]]:
    resp = boto3.client("ec2", region_name="us-east-1").describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for r in resp["Reservations"] for i in r["Instances"]]


def nodes(c: Any) -> list[Node]:
    with c.store.session() as s:
        return list(s.exec(select(Node).where(Node.pool != "a100").order_by(Node.id)).all())


def fill_onprem(c: Any, eng: Engine) -> int:
    """A low job holding the whole on-prem pool, so the next one has to rent (long enough to
    outlast a test on a loaded machine: each test cancels it when done)."""
    hog = c.submit(name="hog", team="research", command=train(4000, step_s=0.05),
                   gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(hog).status == "RUNNING")
    return hog


def finish(c: Any, eng: Engine, hog: int) -> None:
    c.cancel(hog)
    drive(eng, lambda: c.get(hog).status == "CANCELLED"
          and all(n.state == NodeState.TERMINATED for n in nodes(c)))


def test_low_job_rents_spot_runs_there_and_the_idle_node_is_given_back(cloud_cluster, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(6), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert c.get(j).attempt_list[-1].pool == "spot"
    with c.store.session() as s:  # it ran through the agent the instance booted
        [att] = s.exec(select(Attempt).where(Attempt.job_id == j)).all()
        assert att.handles[0]["kind"] == "agent"
    [joined] = [e for e in c.events() if e.kind == "agent_joined"]
    assert joined.data["agent"]["booted_from_user_data"] is True
    [inst] = _all_instances()
    assert inst.get("InstanceLifecycle") == "spot"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags[TAG_POOL] == "spot" and tags[TAG_BROKER] == eng.capacity.broker_id
    drive(eng, lambda: all(n.state == NodeState.TERMINATED for n in nodes(c)))
    assert nodes(c)[0].end_reason == "idle" and running_instances() == []
    kinds = [e.kind for e in c.events()]
    assert "node_launching" in kinds and "node_terminated" in kinds
    finish(c, eng, hog)


def test_no_capacity_on_the_cheapest_pool_falls_through_to_the_next(cloud_cluster, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool("cheap", 1.0), spot_pool("dear", 3.0)],
                          cloud_after_wait_s=0)
    cheap = AwsProvider("us-east-1", image=AMI)
    err = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none left"}}
    cheap.ec2.run_instances = failing(cheap.ec2.run_instances,  # type: ignore[method-assign]
                                      lambda: ClientError(err, "RunInstances"), 100)
    eng.capacity.providers["cheap"] = cheap
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(4), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert c.get(j).attempt_list[-1].pool == "dear"
    assert "no_capacity" in [e.kind for e in c.events(j)]
    finish(c, eng, hog)


@pytest.mark.both_dbs
def test_spot_interruption_checkpoints_requeues_and_resumes(cloud_cluster, aws_mock):
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName="spot-events")["QueueUrl"]
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool(options={"queue_url": queue})],
                          cloud_after_wait_s=0, grace_s=30)
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(60, step_s=0.05, ckpt_every=5),
                 gpus_per_node=2, priority="low").id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 0)
    [inst] = running_instances()
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({
        "version": "0", "source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning",
        "time": "2026-12-02T10:00:00Z", "detail": {"instance-id": inst["InstanceId"],
                                                    "instance-action": "terminate"}}))
    drive(eng, lambda: len(c.get(j).attempt_list) >= 2)
    first = c.get(j).attempt_list[0]
    assert first.end_reason == "INTERRUPTED" and first.reached_step is not None
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    info = c.get(j)
    assert info.attempt_list[-1].restored_step == first.reached_step  # checkpointed on the notice
    assert info.attempt_list[-1].pool == "spot"
    kinds = [e.kind for e in c.events()]
    assert {"interruption_notice", "checkpoint_requested", "interrupted"} <= set(kinds)
    finish(c, eng, hog)


@pytest.mark.both_dbs
def test_a_crash_between_launch_and_the_db_write_leaves_exactly_one_instance(cloud_cluster, clock,
                                                                             aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    eng.capacity.background = False  # the pool's round runs inside the cycle: its crash is ours
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(4), gpus_per_node=2, priority="low").id

    class Crash(BaseException):
        """The broker process dies (nothing catches it)."""

    def crash(*a: Any, **kw: Any) -> None:
        raise Crash("broker killed after the launch call, before writing its answer")

    with pytest.MonkeyPatch.context() as mp, pytest.raises(Crash):
        mp.setattr(eng.capacity, "launched", crash)
        for _ in range(3):  # the plan writes the row; the next round calls launch, then dies
            eng.cycle()
    [row] = nodes(c)
    assert row.state == NodeState.LAUNCHING and row.instance_id is None and row.token
    assert len(running_instances()) == 1
    clock.advance(eng.settings.lease_s)  # the crashed broker's lease runs out
    eng2 = Engine(c.store, clock, eng.executor)  # the restarted broker
    eng2.reconcile()
    drive(eng2, lambda: c.get(j).status == "SUCCEEDED")
    assert len({i["InstanceId"] for i in _all_instances()}) == 1
    finish(c, eng2, hog)
    eng2.close()


def _all_instances() -> list[dict[str, Any]]:
    resp = boto3.client("ec2", region_name="us-east-1").describe_instances()
    return [i for r in resp["Reservations"] for i in r["Instances"]]


def test_orphans_are_terminated_and_lost_nodes_requeue_their_job(cloud_cluster, clock, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    ec2 = boto3.client("ec2", region_name="us-east-1")
    tags = {TAG_BROKER: eng.capacity.broker_id, TAG_POOL: "spot", TAG_NODE: "spot-unknown"}
    orphan = ec2.run_instances(ImageId=AMI, InstanceType="g5.12xlarge", MinCount=1, MaxCount=1,
                               TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                   {"Key": k, "Value": v} for k, v in tags.items()]}])
    other = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
    eng.reconcile()  # the spot pool's worker sweeps at once
    orphan_id = orphan["Instances"][0]["InstanceId"]
    drive(eng, lambda: orphan_id not in {i["InstanceId"] for i in running_instances()})
    assert other["Instances"][0]["InstanceId"] in {i["InstanceId"] for i in running_instances()}
    ec2.terminate_instances(InstanceIds=[other["Instances"][0]["InstanceId"]])  # not ours: left alone
    assert "orphan_terminated" in [e.kind for e in c.events()]
    # A node the database thinks alive, gone from the cloud: its job ends LOST and requeues,
    # once the broker has confirmed the instance gone.
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(400, step_s=0.05), gpus_per_node=2,
                 priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    [inst] = running_instances()
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    drive(eng, lambda: c.get(j).attempt_list[0].end_reason == "LOST")
    [lost] = [n for n in nodes(c) if n.end_reason == "lost"]
    assert lost.state == NodeState.TERMINATED and lost.ended_at is not None
    assert c.get(j).attempt_list[0].cause == "node_lost"
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    finish(c, eng, hog)


def test_a_pool_that_loses_its_price_is_closed_and_says_so_never_free(cloud_cluster):
    """The catalog no longer prices a catalog-priced pool (refused at apply; here the catalog
    changed since): the pool is closed to launches and an event says why, once."""
    from pricing.catalog import Catalog

    c, eng = cloud_cluster(pools=[ONPREM, spot_pool(price=0.0)], cloud_after_wait_s=0)
    eng.capacity._catalog = Catalog([])
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(4), gpus_per_node=2, priority="low").id
    for _ in range(5):
        eng.cycle()
    assert nodes(c) == [] and c.get(j).status == "PENDING"
    unpriced = [e for e in c.events() if e.kind == "pool_unpriced"]
    assert len(unpriced) == 1 and "set price_per_node_hour" in unpriced[0].message
    assert "g5.12xlarge" in unpriced[0].message
    finish(c, eng, hog)

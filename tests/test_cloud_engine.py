"""The engine renting AWS spot capacity (moto in-process), with real job processes.

Every test ends with no instance running in moto (tests/conftest.py checks it)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from sqlmodel import select

from broker.control.engine import Engine
from broker.state.model import Node, NodeState
from providers.aws import AwsProvider
from providers.base import TAG_BROKER, TAG_NODE, TAG_POOL
from tests.conftest import drive, train
from tests.providers.harness import failing

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


def test_low_job_rents_spot_runs_there_and_the_idle_node_is_given_back(make_cluster, aws_mock):
    c, eng = make_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(6), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert c.get(j).attempt_list[-1].pool == "spot"
    [inst] = _all_instances()
    assert inst.get("InstanceLifecycle") == "spot"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags[TAG_POOL] == "spot" and tags[TAG_BROKER] == eng.capacity.broker_id
    drive(eng, lambda: all(n.state == NodeState.TERMINATED for n in nodes(c)))
    assert nodes(c)[0].end_reason == "idle" and running_instances() == []
    kinds = [e.kind for e in c.events()]
    assert "node_launching" in kinds and "node_terminated" in kinds
    finish(c, eng, hog)


def test_no_capacity_on_the_cheapest_pool_falls_through_to_the_next(make_cluster, aws_mock):
    c, eng = make_cluster(pools=[ONPREM, spot_pool("cheap", 1.0), spot_pool("dear", 3.0)],
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


def test_spot_interruption_checkpoints_requeues_and_resumes(make_cluster, aws_mock):
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName="spot-events")["QueueUrl"]
    c, eng = make_cluster(pools=[ONPREM, spot_pool(options={"queue_url": queue})],
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


def test_a_crash_between_launch_and_the_db_write_leaves_exactly_one_instance(make_cluster, clock,
                                                                             aws_mock):
    c, eng = make_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(4), gpus_per_node=2, priority="low").id

    class Crash(Exception):
        pass

    def crash(*a: Any, **kw: Any) -> None:
        raise Crash("broker killed after the launch call, before writing its answer")

    with pytest.MonkeyPatch.context() as mp, pytest.raises(Crash):
        mp.setattr(eng.capacity, "_set", crash)
        eng.cycle()
    [row] = nodes(c)
    assert row.state == NodeState.LAUNCHING and row.instance_id is None and row.token
    assert len(running_instances()) == 1
    eng2 = Engine(c.store, clock, eng.executor)  # the restarted broker
    eng2.reconcile()
    drive(eng2, lambda: c.get(j).status == "SUCCEEDED")
    assert len({i["InstanceId"] for i in _all_instances()}) == 1
    finish(c, eng2, hog)


def _all_instances() -> list[dict[str, Any]]:
    resp = boto3.client("ec2", region_name="us-east-1").describe_instances()
    return [i for r in resp["Reservations"] for i in r["Instances"]]


def test_orphans_are_terminated_and_lost_nodes_requeue_their_job(make_cluster, clock, aws_mock):
    c, eng = make_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    ec2 = boto3.client("ec2", region_name="us-east-1")
    tags = {TAG_BROKER: eng.capacity.broker_id, TAG_POOL: "spot", TAG_NODE: "spot-unknown"}
    orphan = ec2.run_instances(ImageId=AMI, InstanceType="g5.12xlarge", MinCount=1, MaxCount=1,
                               TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                   {"Key": k, "Value": v} for k, v in tags.items()]}])
    other = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
    eng.reconcile()
    live = {i["InstanceId"] for i in running_instances()}
    assert orphan["Instances"][0]["InstanceId"] not in live
    assert other["Instances"][0]["InstanceId"] in live  # not ours: left alone
    ec2.terminate_instances(InstanceIds=[other["Instances"][0]["InstanceId"]])
    assert "orphan_terminated" in [e.kind for e in c.events()]
    # A node the database thinks alive, gone from the cloud: its job ends LOST and requeues.
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(400, step_s=0.05), gpus_per_node=2,
                 priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    [inst] = running_instances()
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    drive(eng, lambda: c.get(j).attempt_list[0].end_reason == "LOST")
    assert "lost" in [n.end_reason for n in nodes(c)]
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    finish(c, eng, hog)

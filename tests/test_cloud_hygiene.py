"""Cloud hygiene all the time: nothing leaks, nothing is placed twice, a slow or broken
cloud API stalls nothing else. AWS is moto in-process; faults are injected by wrapping the
real provider (FaultyProvider). Every test ends with no instance running (conftest checks)."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import boto3
import pytest
from sqlalchemy import update
from sqlmodel import col, select

from broker.control.engine import Engine
from broker.spec import parse_config
from broker.state.model import Node, Notice
from providers.aws import AwsProvider
from providers.base import TAG_BROKER, TAG_NODE, TAG_POOL, Instance, Interruption, LaunchRequest, Transient
from tests.conftest import config, drive, train
from tests.test_cloud_engine import (
    AMI,
    ONPREM,
    fill_onprem,
    finish,
    nodes,
    running_instances,
    spot_pool,
)

# SQLite only, but for the tests marked both_dbs (transactions they depend on): see tests/conftest.py


class FaultyProvider:
    """A real provider with injected faults; everything else is delegated."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.hide: set[str] = set()  # instance ids every listing misses
        self.describe_lies: set[str] = set()  # ids describe() once calls gone while they live
        self.terminate_failures = 0  # the next N terminate() calls raise Transient
        self.launch_error: Exception | None = None
        self.poll_error: Exception | None = None
        self.gate: threading.Event | None = None  # poll() hangs until it is set

    def offers(self) -> Any:
        return self.inner.offers()

    def launch(self, req: LaunchRequest) -> Instance:
        if self.launch_error is not None:
            raise self.launch_error
        return self.inner.launch(req)

    def terminate(self, instance_id: str) -> None:
        if self.terminate_failures > 0:
            self.terminate_failures -= 1
            raise Transient("simulated: terminate throttled (retries ran out)")
        self.inner.terminate(instance_id)

    def poll(self, broker_id: str) -> list[Instance]:
        if self.gate is not None:
            self.gate.wait()
        if self.poll_error is not None:
            raise self.poll_error
        return [i for i in self.inner.poll(broker_id) if i.instance_id not in self.hide]

    def describe(self, instance_id: str) -> Instance | None:
        if instance_id in self.describe_lies:
            self.describe_lies.discard(instance_id)
            return None
        return self.inner.describe(instance_id)

    def interruptions(self) -> list[Interruption]:
        return self.inner.interruptions()

    def ack(self, notices: list[Interruption]) -> None:
        self.inner.ack(notices)


def faulty(eng: Engine, pool: str) -> FaultyProvider:
    prov = FaultyProvider(AwsProvider("us-east-1", image=AMI))
    eng.capacity.providers[pool] = prov
    return prov


def kinds(c: Any, job: int | None = None) -> list[str]:
    return [e.kind for e in c.events(job)]


@pytest.mark.both_dbs
def test_a_listing_that_misses_a_live_instance_changes_nothing(cloud_cluster, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    prov = faulty(eng, "spot")
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(40), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    [inst] = running_instances()
    prov.hide.add(inst["InstanceId"])  # from now on every listing misses it
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert "node_lost" not in kinds(c) and c.get(j).attempts == 1
    prov.hide.clear()
    finish(c, eng, hog)


def test_a_lost_node_is_terminated_and_confirmed_gone_before_its_job_runs_again(cloud_cluster, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    prov = faulty(eng, "spot")
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(400), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    [inst] = running_instances()
    iid = inst["InstanceId"]
    # The listing misses it and a lookup wrongly says it is gone: the broker takes it for lost.
    prov.hide.add(iid)
    prov.describe_lies.add(iid)
    prov.terminate_failures = 10**6  # ... and cannot terminate it for a while
    drive(eng, lambda: "node_lost" in kinds(c))
    for _ in range(10):
        eng.cycle()
    assert c.get(j).status == "RUNNING" and c.get(j).attempts == 1  # not placed again yet
    assert [n.state for n in nodes(c)] == ["terminating"]
    assert {i["InstanceId"] for i in running_instances()} == {iid}  # it was alive all along
    prov.terminate_failures = 0
    drive(eng, lambda: len(c.get(j).attempt_list) == 2)
    assert iid not in {i["InstanceId"] for i in running_instances()}
    evs = c.events()
    order = [e.kind for e in evs if e.kind in ("node_lost", "node_terminated", "node_launching")
             or (e.kind == "started" and e.job_id == j)]
    assert order[-4:] == ["node_lost", "node_terminated", "node_launching", "started"] or \
        order[-4:] == ["node_lost", "node_terminated", "started", "node_launching"]
    a1 = c.get(j).attempt_list[0]
    assert a1.end_reason == "LOST" and a1.cause == "node_lost"
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    finish(c, eng, hog)


def test_orphans_are_swept_every_orphan_sweep_s_not_only_at_start(cloud_cluster, clock, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], orphan_sweep_s=60)
    eng.capacity.background = False  # rounds run inside the cycles: counted exactly
    eng.reconcile()  # the start-up sweep
    ec2 = boto3.client("ec2", region_name="us-east-1")
    tags = {TAG_BROKER: eng.capacity.broker_id, TAG_POOL: "spot", TAG_NODE: "spot-leaked"}
    orphan = ec2.run_instances(ImageId=AMI, InstanceType="g5.12xlarge", MinCount=1, MaxCount=1,
                               TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                   {"Key": k, "Value": v} for k, v in tags.items()]}])["Instances"][0]
    for _ in range(3):
        eng.cycle()
        clock.advance(10)
    assert orphan["InstanceId"] in {i["InstanceId"] for i in running_instances()}  # not due yet
    clock.advance(31)
    eng.cycle()
    assert running_instances() == []
    assert "orphan_terminated" in kinds(c)
    eng.duties_scheduled = True  # the leader's schedule: the sweep_orphans task asks for sweeps
    again = ec2.run_instances(ImageId=AMI, InstanceType="g5.12xlarge", MinCount=1, MaxCount=1,
                              TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                  {"Key": k, "Value": v} for k, v in tags.items()]}])["Instances"][0]
    clock.advance(120)
    eng.cycle()
    assert [i["InstanceId"] for i in running_instances()] == [again["InstanceId"]]  # not asked yet
    eng.sweep_orphans(clock.now())  # the task: the worker sweeps at its next round
    eng.cycle()
    assert running_instances() == []


def test_nodes_of_a_pool_removed_from_the_config_are_drained_and_terminated(cloud_cluster, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0, grace_s=30)
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(400, ckpt_every=5), gpus_per_node=2,
                 priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING" and (c.get(j).last_step or -1) >= 5)
    assert c.get(j).attempt_list[0].pool == "spot"
    c.apply(parse_config(config(pools=[ONPREM], cloud_after_wait_s=0, grace_s=30)))
    c.cancel(hog)
    drive(eng, lambda: len(c.get(j).attempt_list) == 2 and running_instances() == []
          and all(n.state == "terminated" for n in nodes(c)))
    first, second = c.get(j).attempt_list
    assert first.end_reason == "INTERRUPTED" and first.cause == "pool_removed"
    assert second.pool == "a100" and second.restored_step == first.reached_step
    assert [(n.state, n.end_reason) for n in nodes(c)] == [("terminated", "pool_removed")]
    assert "pool_removed" in kinds(c)
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")


def notice(instance_id: str) -> str:
    return json.dumps({"version": "0", "source": "aws.ec2", "time": "2026-12-02T10:00:00Z",
                       "detail-type": "EC2 Spot Instance Interruption Warning",
                       "detail": {"instance-id": instance_id, "instance-action": "terminate"}})


@pytest.mark.both_dbs
def test_a_notice_is_recorded_before_it_is_deleted_and_acted_on_once(cloud_cluster, clock, aws_mock):
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName="spot-events", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool(options={"queue_url": queue})],
                          cloud_after_wait_s=0, grace_s=30)
    eng.capacity.background = False
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(400), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    [inst] = running_instances()
    sqs.send_message(QueueUrl=queue, MessageBody=notice(inst["InstanceId"]))

    class Crash(BaseException):
        """The broker dies after recording the notice, before deleting it from the queue."""

    def crash(*a: Any, **kw: Any) -> None:
        raise Crash

    with pytest.MonkeyPatch.context() as mp, pytest.raises(Crash):
        mp.setattr(eng.capacity.provider("spot"), "ack", crash)
        eng.cycle()
    with c.store.session() as s:
        [row] = s.exec(select(Notice)).all()
    assert row.handled_at is None and row.instance_id == inst["InstanceId"]
    clock.advance(eng.settings.lease_s)
    eng2 = Engine(c.store, clock, eng.executor)  # the next broker gets the message again
    eng2.capacity.background = False
    drive(eng2, lambda: c.get(j).attempt_list[0].end_reason == "INTERRUPTED")
    sqs.send_message(QueueUrl=queue, MessageBody=notice(inst["InstanceId"]))  # a second copy
    drive(eng2, lambda: _handled(c) == 2)
    assert kinds(c).count("interruption_notice") == 1  # acted on once
    assert sqs.receive_message(QueueUrl=queue).get("Messages", []) == []  # all deleted
    c.cancel(j)
    drive(eng2, lambda: c.get(j).status == "CANCELLED")
    finish(c, eng2, hog)
    eng2.close()


def _handled(c: Any) -> int:
    with c.store.session() as s:
        return sum(n.handled_at is not None for n in s.exec(select(Notice)).all())


def test_a_hung_cloud_api_does_not_stall_scheduling(cloud_cluster, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    prov = faulty(eng, "spot")
    prov.gate = threading.Event()  # the listing hangs until the test opens it
    try:
        local = c.submit(name="local", team="research", command=train(3), gpus_per_node=2).id
        rented = c.submit(name="rented", team="research", command=train(3), gpus_per_node=4,
                          gpu_types=["A10G"]).id
        # Had a cycle waited on the hung listing, it would never return (the gate opens only
        # after this): the local job is scheduled, runs and ends by cycles meanwhile.
        drive(eng, lambda: c.get(local).status == "SUCCEEDED")
        assert c.get(rented).status == "PENDING"  # its pool's worker is stuck, nothing else
    finally:
        prov.gate.set()
    drive(eng, lambda: c.get(rented).status == "SUCCEEDED")
    drive(eng, lambda: all(n.state == "terminated" for n in nodes(c)))


def test_an_unexpected_provider_error_closes_that_pool_and_the_broker_goes_on(cloud_cluster, clock,
                                                                             aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool("cheap", 1.0), spot_pool("dear", 3.0)],
                          cloud_after_wait_s=0)
    cheap = faulty(eng, "cheap")
    cheap.launch_error = RuntimeError("boom: a bug in the SDK")
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(4), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert c.get(j).attempt_list[-1].pool == "dear"
    [ev] = [e for e in c.events(j) if e.kind == "launch_failed"]
    assert "RuntimeError" in ev.message and "pool closed" in ev.message
    assert eng.capacity.closed_until["cheap"] > clock.now()
    cheap.launch_error, cheap.poll_error = None, RuntimeError("boom: listing")
    drive(eng, lambda: "provider_error" in kinds(c))  # logged, recorded, the loop goes on
    cheap.poll_error = None
    finish(c, eng, hog)


def test_work_that_finished_before_its_node_was_confirmed_gone_counts_as_completed(cloud_cluster, clock,
                                                                                   tmp_path, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool()], cloud_after_wait_s=0)
    eng.capacity.background = False
    hog = fill_onprem(c, eng)
    gate = tmp_path / "gate"
    wait = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)"
    cmd = [sys.executable, "-c", wait, str(gate)]
    j = c.submit(name="quick", team="research", command=cmd, gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    a = c.get(j).attempt_list[0]
    gate.touch()  # it finishes while the broker looks elsewhere (its agent reports the exit)...
    drive_until(lambda: _rank_state(c, a.id) == "exited")
    [node] = nodes(c)
    with c.store.session() as s:  # ... and then its node is confirmed gone
        s.exec(update(Node).where(col(Node.id) == node.id).values(state="terminated", end_reason="lost"))  # type: ignore[call-overload]
    drive(eng, lambda: c.get(j).status != "RUNNING")
    info = c.get(j)
    assert info.status == "SUCCEEDED" and [x.end_reason for x in info.attempt_list] == ["COMPLETED"]
    boto3.client("ec2", region_name="us-east-1").terminate_instances(InstanceIds=[node.instance_id])
    finish(c, eng, hog)


def drive_until(cond: Any, timeout: float = 30.0) -> None:
    """Wait for another process (an agent) to do something the test cannot await."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def _rank_state(c: Any, attempt_id: int) -> str | None:
    from broker.state.model_access import RankAssignment

    with c.store.session() as s:
        row = s.exec(select(RankAssignment).where(RankAssignment.attempt_id == attempt_id)).first()
        return None if row is None else row.state

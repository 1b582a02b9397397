"""The bill check: rented nodes launched through the AWS provider and the capacity manager in
moto, real jobs run on them (through the agents their user data boots), and the ledger
equals instance-seconds x the price in force, to the cent, with boot, idle, job and drain
time each where it belongs.

The cloud's side of the bill is kept by a thin wrapper around the real AwsProvider: when each
instance was launched (run_instances answered) and terminated (terminate_instances answered),
on the broker's clock. The price is the catalog's for the pool's zone, named as a user names
it (us-east-1d), which AWS prices by AZ id (moto maps us-east-1d to use1-az4), and a spot
price refresh mid-life (describe_spot_price_history through botocore's Stubber: moto's price
history is a constant placeholder) changes it from the next cycle on."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from sqlmodel import col, select

from broker.clock import FakeClock
from broker.state import costs
from broker.state.model import Attempt, LedgerEntry, Node, NodeState, PriceChange
from pricing.catalog import Catalog
from providers.aws import AwsProvider
from providers.base import Instance, LaunchRequest
from providers.options import AwsOptions
from tests.conftest import drive, train

AMI = "ami-12345678"
ZONE, ZONE_ID = "us-east-1d", "use1-az4"  # moto's mapping for this account
STEP_S = 20.0  # broker-clock seconds per cycle: long enough for cents to matter
NEW_SPOT = 3.1  # USD per node-hour after the refresh


class CloudBill:
    """The provider as the cloud bills it: the first launch and terminate answer of each
    instance, on the broker's clock. Everything else goes to the real provider."""

    def __init__(self, inner: AwsProvider, clock: FakeClock) -> None:
        self.inner, self.clock = inner, clock
        self.launched: dict[str, float] = {}
        self.terminated: dict[str, float] = {}

    def launch(self, req: LaunchRequest) -> Instance:
        inst = self.inner.launch(req)
        self.launched.setdefault(inst.instance_id, self.clock.now())
        return inst

    def terminate(self, instance_id: str) -> None:
        self.inner.terminate(instance_id)
        self.terminated.setdefault(instance_id, self.clock.now())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def refreshed(cat: Catalog, usd: float) -> Catalog:
    """`cat` after describe_spot_price_history said g5.12xlarge costs `usd` in ZONE now."""
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ec2) as st:
        st.add_response("describe_spot_price_history", {"SpotPriceHistory": [
            {"InstanceType": "g5.12xlarge", "AvailabilityZone": ZONE, "SpotPrice": f"{usd}",
             "Timestamp": dt.datetime(2026, 12, 1, tzinfo=dt.UTC), "ProductDescription": "Linux/UNIX"}]})
        assert cat.refresh_aws(ec2, "us-east-1", {ZONE: ZONE_ID}) == []
    return cat


def test_ledger_equals_instance_seconds_times_price(cloud_cluster, clock, aws_mock):
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName="spot-events")["QueueUrl"]
    spot = {"name": "spot", "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
            "max_nodes": 2, "market": "spot", "region": "us-east-1", "zone": ZONE,
            "instance_type": "g5.12xlarge", "image": AMI, "launch_latency_s": 60,
            "idle_timeout_s": 100, "options": {"queue_url": queue}}  # no price: the catalog's
    onprem = {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}
    c, eng = cloud_cluster(pools=[onprem, spot], cloud_after_wait_s=0, grace_s=3600)
    eng.capacity.close()
    eng.capacity.background = False  # cloud rounds inline in the cycle: the clock is the test's
    bill = CloudBill(AwsProvider("us-east-1", image=AMI, options=AwsOptions(queue_url=queue)), clock)
    eng.capacity.providers["spot"] = bill
    cat = Catalog.snapshot()
    eng.capacity._catalog = cat
    list_price = cat.find("aws", "us-east-1", "g5.12xlarge", "spot", zone=ZONE_ID)
    assert list_price is not None and list_price.usd_per_hour == 2.5445

    hog = c.submit(name="hog", team="research", command=train(4000, step_s=0.05),
                   gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(hog).status == "RUNNING", advance=STEP_S)
    job = c.submit(name="sweep", team="research", command=train(60, step_s=0.05, ckpt_every=5),
                   gpus_per_node=2, priority="low").id
    drive(eng, lambda: len(bill.launched) == 1, advance=STEP_S)
    clock.advance(90)  # the instance boots for a while before the broker sees it running
    drive(eng, lambda: (c.get(job).last_step or -1) >= 0, advance=STEP_S)
    # A spot price move: the catalog is refreshed; the broker records it at its next cycle.
    eng.capacity._catalog = refreshed(cat, NEW_SPOT)
    changed_at = clock.now()
    drive(eng, lambda: _recorded(c) == [list_price.usd_per_hour, NEW_SPOT], advance=STEP_S)
    clock.advance(300)
    [inst] = [i for i in bill.launched if i not in bill.terminated]
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({
        "version": "0", "source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning",
        "time": "2026-12-02T10:00:00Z", "detail": {"instance-id": inst, "instance-action": "terminate"}}))
    drive(eng, lambda: c.get(job).status == "SUCCEEDED", advance=STEP_S)
    drive(eng, lambda: len(bill.terminated) == len(bill.launched) == 2, advance=STEP_S)
    c.cancel(hog)
    drive(eng, lambda: c.get(hog).status == "CANCELLED", advance=STEP_S)

    # The cloud's bill: every second of every instance at the price in force that second.
    def cost(a: float, b: float) -> float:
        cut = min(max(changed_at, a), b)
        return ((cut - a) * list_price.usd_per_hour + (b - cut) * NEW_SPOT) / 3600.0

    expected = sum(cost(bill.launched[i], bill.terminated[i]) for i in bill.launched)
    with c.store.session() as s:
        rows = s.exec(select(LedgerEntry).where(LedgerEntry.pool == "spot", col(LedgerEntry.kind).in_(
            ["boot", "gpu", "idle", "drain"]))).all()  # node time (not checkpoint storage)
        nodes = {n.instance_id: n for n in s.exec(select(Node).where(Node.pool == "spot"))}
        attempts = s.exec(select(Attempt).where(Attempt.pool == "spot")).all()
        views = {by: sum(r.usd for r in costs.costs(s, by)) for by in costs.COST_BY}
    charged = sum(r.usd for r in rows)
    assert expected > 0.25  # long enough that cents are a real check
    assert round(charged, 2) == round(expected, 2)
    assert charged == pytest.approx(expected, abs=1e-9)
    # Every second is charged as one kind: boot from the launch answered to ready, the job's GPUs
    # while its attempts ran, drain from the notice to the confirmed end, idle otherwise.
    gpu_h = {k: sum(r.gpus * (r.end - r.start) for r in rows if r.kind == k) / 3600 for k in
             ("boot", "gpu", "idle", "drain")}
    assert len(nodes) == 2 and all(n.state == NodeState.TERMINATED for n in nodes.values())
    assert {nodes[i].launched_at: bill.launched[i] for i in nodes} == \
        {bill.launched[i]: bill.launched[i] for i in nodes}
    boot = sum((n.ready_at or 0) - (n.launched_at or 0) for n in nodes.values()) * 4 / 3600
    # An agent's join (the API's thread) can race a cycle that charges the node as booting:
    # the boot/idle split may then move by one cycle; the total above is exact regardless.
    assert boot >= 90 * 4 / 3600 and gpu_h["boot"] == pytest.approx(boot, abs=2 * STEP_S * 4 / 3600)
    assert gpu_h["gpu"] == pytest.approx(sum(a.gpus * ((a.ended_at or 0) - a.started_at)
                                             for a in attempts) / 3600)
    interrupted = next(n for n in nodes.values() if n.end_reason == "interrupted")
    notice = _event_time(c, "interruption_notice")
    [first] = [a for a in attempts if a.end_reason == "INTERRUPTED"]
    drain = (4 * ((interrupted.ended_at or 0) - notice) - 2 * ((first.ended_at or 0) - notice)) / 3600
    # The other node drains from the decision to give it back until its end is confirmed.
    [other] = [n for n in nodes.values() if n is not interrupted]
    released = next(e.time for e in c.events()
                    if e.kind == "node_releasing" and e.data.get("node") == other.id)
    drain += 4 * ((other.ended_at or 0) - released) / 3600
    assert drain > 0 and gpu_h["drain"] == pytest.approx(drain)
    total_gpu_h = sum(4 * (bill.terminated[i] - bill.launched[i]) for i in bill.launched) / 3600
    assert sum(gpu_h.values()) == pytest.approx(total_gpu_h)
    # Who pays: the job its GPUs, the pool the rest; one total in every view.
    assert {r.job_id for r in rows if r.kind == "gpu"} == {job}
    assert all(r.job_id is None and r.team is None for r in rows if r.kind != "gpu")
    assert max(views.values()) - min(views.values()) < 0.005


def _recorded(c: Any) -> list[float]:
    with c.store.session() as s:
        return [p.usd_per_node_hour for p in s.exec(select(PriceChange).where(PriceChange.pool == "spot")
                                                     .order_by(PriceChange.at, PriceChange.id))]


def _event_time(c: Any, kind: str) -> float:
    return next(e.time for e in c.events() if e.kind == kind)

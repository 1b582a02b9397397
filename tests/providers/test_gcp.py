"""GCP launches a cloud engineer would accept, through the real google-cloud-compute client and
the Compute fake: GPUs on N1 types as guest accelerators of the zone tried, zones in order,
TERMINATE on host maintenance, a service account with scopes, an image family, valid names
and labels from any pool name, operations awaited while RUNNING, preemptions read in every
zone and recorded in the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.clock import FakeClock
from broker.state.notices import DbNoticeLog
from broker.state.store import Store
from providers.base import TAG_NODE, TAG_POOL, Fatal, NoCapacity
from providers.names import RFC1035, label_value
from tests.providers.gcp_fake import State, gcp_provider
from tests.providers.harness import BROKER, request

ZONES = ["us-central1-a", "us-central1-b"]


def inserted(state: State, iid: str) -> dict[str, Any]:
    zone, name = iid.split("/")
    return state.instances[(zone, name)]


def test_an_n1_node_gets_its_gpus_as_guest_accelerators_of_its_zone(gcp_fake: tuple[str, State]) -> None:
    url, state = gcp_fake
    p = gcp_provider(url, ZONES, gpu_type="T4", gpus=2)
    inst = p.launch(request(instance_type="n1-standard-8"))
    body = inserted(state, inst.instance_id)
    assert body["guestAccelerators"] == [
        {"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 2}]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    p.terminate(inst.instance_id)


def test_an_accelerator_optimized_type_gets_no_guest_accelerators(gcp_fake: tuple[str, State]) -> None:
    url, state = gcp_fake
    p = gcp_provider(url, ZONES, gpu_type="A100", gpus=1)
    inst = p.launch(request(instance_type="a2-highgpu-1g", market="on_demand"))
    body = inserted(state, inst.instance_id)
    assert "guestAccelerators" not in body
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE"}  # GPUs cannot live-migrate
    p.terminate(inst.instance_id)


def test_a_zone_without_the_accelerator_passes_the_launch_to_the_next(gcp_fake: tuple[str, State]) -> None:
    url, state = gcp_fake
    p = gcp_provider(url, ZONES, gpu_type="V100", gpus=1)  # us-central1-a has no V100s
    inst = p.launch(request(instance_type="n1-standard-8"))
    assert inst.zone == "us-central1-b"
    assert inserted(state, inst.instance_id)["guestAccelerators"][0]["acceleratorType"] == \
        "zones/us-central1-b/acceleratorTypes/nvidia-tesla-v100"
    p.terminate(inst.instance_id)
    nowhere = gcp_provider(url, ["us-central1-a", "us-central1-c"], gpu_type="V100")
    with pytest.raises(Fatal) as e:
        nowhere.launch(request(node="pool-a-0002", token="tok-0002", instance_type="n1-standard-8"))
    assert "nvidia-tesla-v100 is not offered in us-central1-a (zones that offer it: us-central1-b)" \
        in str(e.value)


def test_a_zone_out_of_capacity_passes_the_launch_to_the_next(gcp_fake: tuple[str, State]) -> None:
    url, state = gcp_fake
    state.fail_zones["us-central1-a"] = "ZONE_RESOURCE_POOL_EXHAUSTED"
    p = gcp_provider(url, ZONES, gpu_type="T4")
    inst = p.launch(request(instance_type="n1-standard-8"))
    assert inst.zone == "us-central1-b" and inst.instance_id == f"us-central1-b/{inst.tags[TAG_NODE]}"
    assert p.launch(request(instance_type="n1-standard-8")).instance_id == inst.instance_id  # found by name
    p.terminate(inst.instance_id)
    state.fail_zones["us-central1-b"] = "ZONE_RESOURCE_POOL_EXHAUSTED"
    with pytest.raises(NoCapacity, match="us-central1-a, us-central1-b"):
        p.launch(request(node="pool-a-0002", token="tok-0002", instance_type="n1-standard-8"))


def test_the_node_runs_as_the_pools_service_account_from_an_image_family(gcp_fake: tuple[str, State]) -> None:
    url, state = gcp_fake
    p = gcp_provider(url, gpu_type="L4", service_account="onepool-node@lab.iam.gserviceaccount.com",
                     root_volume_gb=300, external_ip=True)
    inst = p.launch(request(instance_type="g2-standard-8"))
    body = inserted(state, inst.instance_id)
    assert body["serviceAccounts"] == [{"email": "onepool-node@lab.iam.gserviceaccount.com", "scopes": [
        "https://www.googleapis.com/auth/devstorage.read_write", "https://www.googleapis.com/auth/logging.write"]}]
    disk = body["disks"][0]["initializeParams"]
    assert disk["sourceImage"].startswith("projects/deeplearning-platform-release/global/images/family/")
    assert disk["diskSizeGb"] == "300"
    [nic] = body["networkInterfaces"]
    assert nic["accessConfigs"] == [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    assert body["tags"] == {"items": ["onepool-node"]}  # what infra/gcp's firewall rule targets
    p.terminate(inst.instance_id)


def test_any_pool_name_makes_a_valid_instance_name_and_labels(gcp_fake: tuple[str, State]) -> None:
    """GCP names are RFC 1035 and label values take no '.': the ids travel verbatim in metadata."""
    url, state = gcp_fake
    p = gcp_provider(url, gpu_type="T4")
    node = "7gpu.t4_spot-pool-with-a-long-name-that-goes-past-the-limit-0a1b2c3d"
    inst = p.launch(request(node=node, pool="7gpu.t4_spot", instance_type="n1-standard-8"))
    body = inserted(state, inst.instance_id)
    assert RFC1035.match(body["name"]) and len(body["name"]) <= 63
    assert body["labels"]["onepool-pool"] == "7gpu-t4_spot" == label_value("7gpu.t4_spot")
    assert all(len(v) <= 63 and "." not in v for v in body["labels"].values())
    [seen] = p.poll(BROKER)
    assert (seen.tags[TAG_NODE], seen.tags[TAG_POOL]) == (node, "7gpu.t4_spot")
    again = gcp_provider(url, gpu_type="T4").launch(
        request(node=node, pool="7gpu.t4_spot", instance_type="n1-standard-8"))
    assert again.instance_id == inst.instance_id
    p.terminate(inst.instance_id)


def test_the_launch_waits_while_its_operation_is_running(gcp_fake: tuple[str, State]) -> None:
    url, state = gcp_fake
    state.op_polls = 3
    p = gcp_provider(url, gpu_type="A100")
    inst = p.launch(request(instance_type="a2-highgpu-1g"))
    assert state.polled == 4  # three answers RUNNING, then DONE
    assert inst.state.value == "running"
    state.polled = 0
    p.terminate(inst.instance_id)
    assert state.polled == 4 and p.poll(BROKER) == []


def test_preemptions_are_read_in_every_zone_until_acknowledged_and_remembered_in_the_database(
        gcp_fake: tuple[str, State], tmp_path: Path) -> None:
    url, state = gcp_fake
    store, clock = Store(tmp_path / "home"), FakeClock()
    p = gcp_provider(url, ZONES, gpu_type="T4")
    p.notices = DbNoticeLog(store, "pool-a", clock)
    a = p.launch(request(instance_type="n1-standard-8"))
    state.fail_zones["us-central1-a"] = "ZONE_RESOURCE_POOL_EXHAUSTED"
    b = p.launch(request(node="pool-a-0002", token="tok-0002", instance_type="n1-standard-8"))
    assert (a.zone, b.zone) == ("us-central1-a", "us-central1-b")
    for inst in (a, b):
        state.preempt(*inst.instance_id.split("/"))
    first = p.interruptions()
    assert sorted((i.instance_id, i.kind) for i in first) == [
        (a.instance_id, "preempted"), (b.instance_id, "preempted")]
    assert all(i.key for i in first)
    again = p.interruptions()  # not acknowledged (the broker died before recording): again
    assert [i.key for i in again] == [i.key for i in first]
    p.ack(again)
    assert p.interruptions() == []
    restarted = gcp_provider(url, ZONES, gpu_type="T4")  # a new broker process, same database
    restarted.notices = DbNoticeLog(store, "pool-a", clock)
    assert restarted.interruptions() == []
    c = restarted.launch(request(node="pool-a-0003", token="tok-0003", instance_type="n1-standard-8"))
    state.preempt(*c.instance_id.split("/"))
    new = restarted.interruptions()
    assert [i.instance_id for i in new] == [c.instance_id]
    restarted.ack(new)
    other_pool = gcp_provider(url, ZONES, gpu_type="T4")
    other_pool.notices = DbNoticeLog(store, "pool-b", clock)  # notices are per pool
    assert len(other_pool.interruptions()) == 3

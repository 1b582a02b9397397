"""libcloud clouds that boot an agent: user data through each driver's own argument, driver
arguments from the pool's options checked against the real signatures, spot where the driver
has it, unknown images and sizes named, every driver exception mapped.

Azure ARM (the worked example) runs libcloud's real AzureNodeDriver over a fake Resource
Manager; the other drivers are fakes with their real classes' signatures."""

from __future__ import annotations

import base64
import inspect
from typing import Any

import pytest
from libcloud.compute.drivers.dummy import DummyNodeDriver
from libcloud.compute.drivers.ec2 import EC2NodeDriver
from libcloud.compute.drivers.linode import LinodeNodeDriverV4
from libcloud.compute.drivers.openstack import OpenStack_2_NodeDriver
from libcloud.compute.drivers.outscale import OutscaleNodeDriver
from libcloud.compute.drivers.vultr import VultrNodeDriverV2

from providers.base import TAG_BROKER, TAG_NODE, Fatal
from providers.libcloud.profiles import PROFILES
from tests.providers.azure_fake import AZURE_IMAGE, AZURE_OPTIONS, azure_driver
from tests.providers.harness import BOOT, BROKER, request
from tests.providers.libcloud_fake import libcloud_provider as provider
from tests.providers.libcloud_fake import signature_fake

A100 = "Standard_NC24ads_A100_v4"


def azure(**changes: Any) -> tuple[Any, Any]:
    drv, arm = azure_driver()
    opts = {**AZURE_OPTIONS, "image": AZURE_IMAGE, **changes}
    return provider(drv, **{k: v for k, v in opts.items() if v is not None}), arm


def test_azure_arm_boots_the_agent_from_custom_data_in_the_pools_resource_group() -> None:
    p, arm = azure()
    inst = p.launch(request(instance_type=A100, market="on_demand"))
    assert inst.instance_id.endswith(
        "/resourceGroups/onepool/providers/Microsoft.Compute/virtualMachines/pool-a-0001")
    body = arm.bodies[inst.instance_id]
    assert base64.b64decode(body["properties"]["osProfile"]["customData"]).decode() == BOOT
    assert body["tags"] == {"cost-center": "ml-research", TAG_BROKER: BROKER, "onepool-pool": "pool-a",
                            TAG_NODE: "pool-a-0001", "onepool-job": "7"}
    assert body["properties"]["hardwareProfile"] == {"vmSize": A100}
    assert body["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == \
        AZURE_OPTIONS["auth"]["ssh_key"]
    assert body["properties"]["storageProfile"]["osDisk"]["diskSizeGB"] == 256
    assert body["properties"]["storageProfile"]["imageReference"]["version"] == "latest"
    [seen] = p.poll(BROKER)
    assert seen.node_id == "pool-a-0001"
    p.terminate(inst.instance_id)
    assert p.poll(BROKER) == [] and arm.nics == {}  # its NIC went with it


def test_libcloud_3_9_1_cannot_send_azure_custom_data_unaided_and_the_provider_maps_that() -> None:
    """apache/libcloud#1893: AzureNodeDriver.create_node base64-encodes ex_customdata with
    b64encode (a str raises TypeError) and puts the bytes in a JSON body (bytes raise
    TypeError). The provider fixes the connection's encoder; a TypeError never escapes it."""
    drv, _ = azure_driver()
    p = provider(drv, **{**AZURE_OPTIONS, "image": AZURE_IMAGE})
    args = {"name": "n", "size": p._size(A100), "image": p._image(AZURE_IMAGE),
            "auth": p.auth, **AZURE_OPTIONS["create_node"]}
    with pytest.raises(TypeError, match="bytes-like object is required"):
        drv.create_node(ex_customdata=BOOT, **args)
    with pytest.raises(Fatal, match="TypeError: a bytes-like object is required"):
        p._call(drv.create_node, ex_customdata=BOOT, **args)
    unpatched, _ = azure_driver()
    with pytest.raises(TypeError, match="not JSON serializable"):
        unpatched.create_node(ex_customdata=BOOT.encode(), **{**args, "name": "m"})


@pytest.mark.parametrize(("changes", "needle"), [
    ({"create_node": {"ex_network": "onepool-vnet", "ex_use_managed_disks": True}},
     "create_node needs ex_resource_group: set options.create_node"),
    ({"auth": None}, "create_node needs auth"),
    ({"create_node": {**AZURE_OPTIONS["create_node"], "ex_priority": "Spot"}},
     "create_node does not take ex_priority"),
    ({"destroy_node": {"ex_poll_interval": 1}}, "destroy_node does not take ex_poll_interval"),
])
def test_driver_arguments_are_checked_against_the_real_signature(changes: dict[str, Any],
                                                                 needle: str) -> None:
    with pytest.raises(Fatal) as e:
        azure(**changes)
    assert needle in str(e.value) and "it takes" in str(e.value)


def test_an_unknown_image_or_size_names_the_ones_that_exist() -> None:
    p, _ = azure(image="Canonical:ubuntu-24_04-lts:server:24.04.1")
    with pytest.raises(Fatal) as e:
        p.launch(request(instance_type=A100, market="on_demand"))
    assert "no image 'Canonical:ubuntu-24_04-lts:server:24.04.1'" in str(e.value)
    assert "24.04.202410010, " in str(e.value) or "server:24.04.202410010" in str(e.value)
    ec2 = provider(signature_fake(EC2NodeDriver), image="ami-nope")
    with pytest.raises(Fatal, match=r"no image 'ami-nope'.*ami-gpu-ubuntu-2204, ami-gpu-ubuntu-2404"):
        ec2.launch(request())
    with pytest.raises(Fatal, match=r"no size 'p5\.48xlarge'.*sizes that exist: g5\.xlarge, p4d\.24xlarge"):
        ec2.launch(request(instance_type="p5.48xlarge"))
    with pytest.raises(Fatal, match=r"no location 'eu-west-1a'.*that exist: us-east-1a, us-east-1b"):
        provider(signature_fake(EC2NodeDriver), zone="eu-west-1a").launch(request())


def test_spot_where_the_driver_has_it() -> None:
    drv = signature_fake(EC2NodeDriver)
    inst = provider(drv).launch(request(market="spot"))
    assert drv.cloud.created[inst.instance_id]["ex_spot"] is True
    p, _ = azure()
    with pytest.raises(Fatal, match="azure_arm: the driver has no spot option; use market: on_demand"):
        p.launch(request(instance_type=A100, market="spot"))


# every profile against its driver's real create_node: (driver class, extra create_node args, zone)
DRIVERS = [(EC2NodeDriver, {}, None), (OpenStack_2_NodeDriver, {}, None),
           (VultrNodeDriverV2, {}, "us-east-1a"), (LinodeNodeDriverV4, {}, "us-east-1a")]


@pytest.mark.parametrize(("real", "extra", "zone"), DRIVERS, ids=[d[0].__name__ for d in DRIVERS])
def test_every_profile_binds_its_drivers_real_create_node(real: Any, extra: dict[str, Any],
                                                          zone: str | None) -> None:
    drv = signature_fake(real)
    assert inspect.signature(drv.create_node) == inspect.signature(real.create_node.__get__(drv))
    profile = PROFILES[str(real.type)]
    p = provider(drv, zone=zone, create_node=extra)
    node = "pool-a-0a1b2c3d"  # as the broker names nodes: drivers without tags are found by it
    inst = p.launch(request(node=node, market="spot" if profile.spot else "on_demand"))
    assert drv.cloud.created[inst.instance_id][profile.user_data] == BOOT
    assert [i.instance_id for i in p.poll(BROKER)] == [inst.instance_id]  # by tag, or by name
    p.terminate(inst.instance_id)
    assert p.poll(BROKER) == []


@pytest.mark.parametrize(("real", "needle"), [
    (DummyNodeDriver, "create_node takes no user data, so the node could not start its onepool agent"),
    (OutscaleNodeDriver, "outscale: create_node does not take size"),  # it takes ex_vm_type
])
def test_drivers_onepool_cannot_drive_are_refused_saying_why(real: Any, needle: str) -> None:
    with pytest.raises(Fatal) as e:
        provider(signature_fake(real))
    assert needle in str(e.value)

"""The REAL libcloud Azure ARM driver (AzureNodeDriver, its own create_node with its own
signature and request bodies) in front of a fake Azure Resource Manager.

The fake replaces only `driver.connection.request`: every body the driver builds still goes
through the connection's own encode_data (json.dumps), so what the real driver would fail to
send fails here too (libcloud 3.9.1's ex_customdata bug, apache/libcloud#1893). It answers the
calls a node's life makes: VM sizes, image versions of a sku, NIC create/get/delete, VM
create/get/list/delete with its instance view, managed disk delete.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from libcloud.common.azure_arm import AzureResourceManagementConnection
from libcloud.common.exceptions import exception_from_message
from libcloud.compute.drivers.azure_arm import AzureNodeDriver

SUB = "00000000-0000-0000-0000-000000000001"
SIZES = {"Standard_NC24ads_A100_v4": 24, "Standard_NC4as_T4_v3": 4}
IMAGES = {"Canonical:ubuntu-24_04-lts:server": ["24.04.202410010", "24.04.202411030"],
          "microsoft-dsvm:ubuntu-hpc:2204": ["22.04.2024102301"]}


@dataclass
class _Resp:
    object: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class ArmFake:
    """Azure Resource Manager behind one AzureNodeDriver; `fail` holds (HTTP status, Azure
    error code) answers for the next VM creations."""

    def __init__(self, driver: AzureNodeDriver) -> None:
        self.driver = driver
        self.vms: dict[str, dict[str, Any]] = {}
        self.nics: dict[str, dict[str, Any]] = {}
        self.bodies: dict[str, dict[str, Any]] = {}  # VM id -> the body the driver sent
        self.fail: list[tuple[int, str]] = []
        self.calls: list[tuple[str, str]] = []
        self.ips = itertools.count(4)
        driver.connection.request = self.request

    def request(self, action: str, params: Any = None, data: Any = None, headers: Any = None,
                method: str = "GET", **_: Any) -> _Resp:
        body = None if data is None else json.loads(self.driver.connection.encode_data(data))
        self.calls.append((method, action))
        loc = r"/subscriptions/[^/]+/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)"
        if re.fullmatch(loc + "/vmSizes", action):
            return _Resp({"value": [{"name": n, "numberOfCores": c, "memoryInMB": c * 8192,
                                     "resourceDiskSizeInMB": 65536, "osDiskSizeInMB": 1047552,
                                     "maxDataDiskCount": 8} for n, c in SIZES.items()]})
        if m := re.fullmatch(loc + "/publishers/(?P<p>[^/]+)/artifacttypes/vmimage/offers/(?P<o>[^/]+)"
                             "/skus/(?P<s>[^/]+)/versions", action):
            versions = IMAGES.get(f"{m['p']}:{m['o']}:{m['s']}", [])
            return _Resp([{"id": f"{action}/{v}", "name": v} for v in versions])
        if re.fullmatch(r"/subscriptions/[^/]+(/resourceGroups/[^/]+)?/providers/Microsoft\.Compute/"
                        r"virtualMachines", action):
            return _Resp({"value": list(self.vms.values())})
        if action.endswith("/InstanceView"):
            return _Resp({"statuses": [{"code": "ProvisioningState/succeeded"},
                                       {"code": "PowerState/running"}]})
        if "/Microsoft.Network/networkInterfaces/" in action:
            return self._nic(action, method, body)
        if "/Microsoft.Compute/virtualMachines/" in action:
            return self._vm(action, method, body)
        if "/Microsoft.Compute/disks/" in action and method == "DELETE":
            return _Resp({}, 202)
        raise exception_from_message(404, f"fake ARM: no route for {method} {action}")

    def _nic(self, action: str, method: str, body: Any) -> _Resp:
        if method == "PUT":
            props = body["properties"]
            props["ipConfigurations"][0]["properties"]["privateIPAddress"] = f"10.0.0.{next(self.ips)}"
            self.nics[action] = {"id": action, "name": action.rsplit("/", 1)[-1],
                                 "location": body["location"], "properties": props}
        if action not in self.nics:
            raise exception_from_message(404, f"ResourceNotFound: {action}")
        if method == "DELETE":
            del self.nics[action]
            return _Resp({}, 202)
        return _Resp(self.nics[action])

    def _vm(self, action: str, method: str, body: Any) -> _Resp:
        if method == "PUT":
            if self.fail:
                status, code = self.fail.pop(0)
                raise exception_from_message(status, json.dumps({"error": {"code": code,
                                                                            "message": f"simulated {code}"}}))
            vm = json.loads(json.dumps(body))
            vm["properties"]["provisioningState"] = "Succeeded"
            disk = vm["properties"]["storageProfile"]["osDisk"]
            if "managedDisk" in disk:
                disk["managedDisk"]["id"] = action.replace("virtualMachines", "disks") + "-osdisk"
            self.vms[action] = vm
            self.bodies[action] = body
        if action not in self.vms:
            raise exception_from_message(404, f"ResourceNotFound: {action}")
        if method == "DELETE":
            del self.vms[action]
            return _Resp({}, 202)
        return _Resp(self.vms[action])


class OfflineConnection(AzureResourceManagementConnection):
    """The real connection, except that it asks no one for a token (ArmFake answers)."""

    def connect(self, *a: Any, **kw: Any) -> None:
        self.access_token, self.expires_on = "fake-token", "9999999999"


class OfflineAzureNodeDriver(AzureNodeDriver):
    """AzureNodeDriver, every method its own, over OfflineConnection."""

    connectionCls = OfflineConnection


def azure_driver() -> tuple[AzureNodeDriver, ArmFake]:
    """A real AzureNodeDriver in eastus over a fresh fake Resource Manager."""
    drv = OfflineAzureNodeDriver(tenant_id="tenant", subscription_id=SUB, key="client-id",
                                 secret="client-secret", region="eastus")
    return drv, ArmFake(drv)


AZURE_OPTIONS: dict[str, Any] = {
    "driver": "AZURE_ARM",
    "sizes": {"Standard_NC24ads_A100_v4": ["A100", 1]},
    "create_node": {"ex_resource_group": "onepool", "ex_network": "onepool-vnet", "ex_subnet": "nodes",
                    "ex_use_managed_disks": True, "ex_os_disk_delete": True, "ex_disk_size": 256},
    "list_nodes": {"ex_resource_group": "onepool", "ex_fetch_nic": False},
    "destroy_node": {"ex_poll_wait": 0},
    "auth": {"ssh_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnepool ops@lab"},
    "tags": {"cost-center": "ml-research"},
}
AZURE_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"

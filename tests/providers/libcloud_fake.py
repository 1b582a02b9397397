"""A small fake libcloud NodeDriver (libcloud's Dummy ignores names and sizes and has no GPU
data): nodes in a dict, ex_metadata kept as tags, injected native errors."""

from __future__ import annotations

import itertools
from typing import Any

from libcloud.common.exceptions import RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeSize
from libcloud.compute.types import NodeState

from providers.libcloud import LibcloudProvider
from tests.providers.harness import Harness


class FakeGpuDriver(NodeDriver):
    name = "fake-gpu"
    type = "fake"

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.ids = itertools.count(1)
        self.fail: list[Exception] = []

    def list_sizes(self, location: Any = None) -> list[NodeSize]:
        return [NodeSize("g5.xlarge", "1 x A10G", 16384, 200, 0, 1.0, self),
                NodeSize("Standard_NC24ads_A100_v4", "1 x A100", 225280, 64, 0, 3.67, self)]

    def list_images(self, location: Any = None, ex_only_active: bool = True) -> list[NodeImage]:
        return [NodeImage("ubuntu-22.04-cuda", "ubuntu", self)]

    def list_nodes(self) -> list[Node]:
        return list(self.nodes.values())

    def create_node(self, name: str, size: NodeSize, image: NodeImage, **kw: Any) -> Node:
        if self.fail:
            raise self.fail.pop(0)
        nid = f"fake-{next(self.ids)}"
        self.nodes[nid] = Node(nid, name, NodeState.RUNNING, [], [], self,
                               extra={"tags": dict(kw.get("ex_metadata") or {}), "size": size.id})
        return self.nodes[nid]

    def destroy_node(self, node: Node) -> bool:
        node.state = NodeState.TERMINATED
        return True


ERRORS = {"capacity": lambda: LibcloudError("AllocationFailed: no capacity for the size"),
          "quota": lambda: LibcloudError("OperationNotAllowed: quota exceeded for NCADS_A100_v4"),
          "throttle": lambda: RateLimitReachedError(),
          "fatal": lambda: InvalidCredsError("bad key")}


def libcloud_harness() -> Harness:
    drv = FakeGpuDriver()
    prov = LibcloudProvider(drv, {"g5.xlarge": ["A10G", 1]})

    def fail(kind: str, times: int) -> None:
        drv.fail.extend(ERRORS[kind]() for _ in range(times))

    return Harness("libcloud", prov, fail, frozenset(ERRORS))

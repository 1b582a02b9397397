"""Fake libcloud drivers with the REAL signatures of libcloud's drivers.

`signature_fake(RealDriver)` is a NodeDriver whose create_node, list_nodes, destroy_node,
list_images, get_image, list_sizes and list_locations have exactly the real driver's
signatures: `inspect.signature` shows them, and every call binds against them, so a missing
or unknown argument raises the TypeError the real method would. Behind them sits an
in-memory cloud (FakeCloud) that keeps what each create_node call was given, stores tags
where the real driver's nodes carry them, and fails with native errors on demand.

(libcloud's Dummy driver ignores names and sizes and has no GPU data; tests/providers/
azure_fake.py runs the real Azure ARM driver against a fake Resource Manager instead.)
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libcloud.common.exceptions import RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.drivers.ec2 import EC2NodeDriver
from libcloud.compute.types import NodeState

from providers.libcloud import LibcloudProvider
from providers.options import LibcloudOptions
from tests.providers.harness import Harness

# How the real drivers keep tags: (create_node argument, node.extra key); spot: (argument, extra)
TAGS = {"ec2": ("ex_metadata", "tags"), "openstack": ("ex_metadata", "metadata"),
        "azure_arm": ("ex_tags", "tags")}
SPOT = {"ec2": "ex_spot"}
METHODS = ("create_node", "list_nodes", "destroy_node", "list_images", "get_image", "list_sizes",
           "list_locations")


@dataclass
class FakeCloud:
    """The state behind a fake driver."""

    sizes: list[tuple[str, float]] = field(default_factory=lambda: [("g5.xlarge", 1.0),
                                                                    ("p4d.24xlarge", 32.8)])
    images: list[str] = field(default_factory=lambda: ["ami-gpu-ubuntu-2204", "ami-gpu-ubuntu-2404"])
    locations: list[str] = field(default_factory=lambda: ["us-east-1a", "us-east-1b"])
    nodes: dict[str, Node] = field(default_factory=dict)
    created: dict[str, dict[str, Any]] = field(default_factory=dict)  # node id -> create_node args
    fail: list[Exception] = field(default_factory=list)  # raised by the next create_node calls
    ids: Any = field(default_factory=lambda: itertools.count(1))


def _with_signature(real: Callable[..., Any], impl: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(real)

    def method(self: Any, *a: Any, **kw: Any) -> Any:
        bound = sig.bind(self, *a, **kw)  # TypeError, exactly as the real method raises it
        bound.apply_defaults()
        args = dict(bound.arguments)
        args.pop("self", None)
        return impl(self, args)

    method.__signature__ = sig  # type: ignore[attr-defined]
    method.__name__ = real.__name__
    return method


def signature_fake(real: type[NodeDriver], cloud: FakeCloud | None = None) -> Any:
    """An instance of a fake of `real` (e.g. EC2NodeDriver) over `cloud`."""
    kind = str(real.type)

    def create_node(self: Any, a: dict[str, Any]) -> Node:
        c = self.cloud
        if c.fail:
            raise c.fail.pop(0)
        nid = f"fake-{next(c.ids)}"
        extra: dict[str, Any] = {"size": a["size"].id}
        if kind in TAGS:
            extra[TAGS[kind][1]] = dict(a.get(TAGS[kind][0]) or {})
        if SPOT.get(kind) and a.get(SPOT[kind]):
            extra["instance_lifecycle"] = "spot"
        c.nodes[nid] = Node(nid, a["name"], NodeState.RUNNING, [], [], self, extra=extra)
        c.created[nid] = a
        return c.nodes[nid]

    def destroy_node(self: Any, a: dict[str, Any]) -> bool:
        node = next(iter(a.values()))
        self.cloud.nodes[node.id].state = NodeState.TERMINATED
        return True

    def get_image(self: Any, a: dict[str, Any]) -> NodeImage:
        found = [i for i in self.list_images() if i.id == a["image_id"]]
        return found[0]  # IndexError for an unknown id, as EC2NodeDriver.get_image raises

    impl = {
        "create_node": create_node,
        "list_nodes": lambda self, a: list(self.cloud.nodes.values()),
        "destroy_node": destroy_node,
        "list_images": lambda self, a: [NodeImage(i, i, self) for i in self.cloud.images],
        "get_image": get_image,
        "list_sizes": lambda self, a: [NodeSize(s, s, 0, 0, 0, p, self) for s, p in self.cloud.sizes],
        "list_locations": lambda self, a: [NodeLocation(x, x, "US", self) for x in self.cloud.locations],
    }

    def __init__(self: Any, cloud: FakeCloud) -> None:
        self.cloud = cloud

    attrs: dict[str, Any] = {m: _with_signature(getattr(real, m), impl[m]) for m in METHODS}
    attrs.update(__init__=__init__, type=real.type, name=f"fake {real.name}")
    cls = type(f"Fake{real.__name__}", (NodeDriver,), attrs)
    return cls(cloud or FakeCloud())


ERRORS: dict[str, Callable[[], Exception]] = {
    "capacity": lambda: LibcloudError("InsufficientInstanceCapacity: no capacity for the size"),
    "quota": lambda: LibcloudError("VcpuLimitExceeded: quota exceeded for p-family vCPUs"),
    "throttle": lambda: RateLimitReachedError(),
    "fatal": lambda: InvalidCredsError("AuthFailure: bad key"),
    "unexpected": lambda: TypeError("create_node() got an unexpected keyword argument 'ex_x'"),
}


def libcloud_provider(drv: Any, pool: str = "pool-a", **options: Any) -> LibcloudProvider:
    """A LibcloudProvider of `pool` over the driver object `drv`, with options as in
    onepool.yaml (plus `image` and `zone`, the pool's)."""
    image = options.pop("image", "ami-gpu-ubuntu-2204")
    zone = options.pop("zone", None)
    opts = LibcloudOptions.model_validate({"driver": str(drv.type).upper(),
                                           "sizes": {"g5.xlarge": ["A10G", 1]}, **options})
    return LibcloudProvider(drv, opts, pool=pool, image=image, zone=zone)


def libcloud_harness() -> Harness:
    """The contract suite's libcloud: a fake with EC2NodeDriver's signatures (it has spot)."""
    drv = signature_fake(EC2NodeDriver)

    def fail(kind: str, times: int) -> None:
        drv.cloud.fail.extend(ERRORS[kind]() for _ in range(times))

    def market(iid: str) -> str:
        return "spot" if drv.cloud.nodes[iid].extra.get("instance_lifecycle") == "spot" else "on_demand"

    return Harness("libcloud", libcloud_provider(drv), fail, frozenset(ERRORS),
                   boot_script=lambda iid: drv.cloud.created[iid]["ex_userdata"], market_of=market)

"""apache-libcloud: any compute driver by name, credentials from the environment variables
the pool's `credentials` names ("env:KEY_VAR,SECRET_VAR"; never secrets in the config or DB).

libcloud has no common idempotency token or tags API, so:
- the node NAME is the broker's node id, and launch() first lists nodes for that name
  (a retried launch finds the first one);
- the broker's ids go into `ex_metadata` (Azure tags, OpenStack metadata) when the driver
  takes it, and are always recoverable from the name (poll() matches both);
- the GPU type/count of a size comes from the pool's options.sizes ({size id: [type, n]}):
  libcloud's size objects rarely carry it.
"""

from __future__ import annotations

import os
from typing import Any

from providers.base import (
    TAG_BROKER,
    TAG_NODE,
    Fatal,
    Instance,
    InstanceState,
    Interruption,
    LaunchRequest,
    NoCapacity,
    Offer,
    Transient,
)
from providers.retry import retrying

CAPACITY_WORDS = ("capacity", "quota", "allocationfailed", "skunotavailable", "no valid host")


def map_error(e: Exception) -> Exception:
    from libcloud.common.exceptions import RateLimitReachedError
    from libcloud.common.types import InvalidCredsError, LibcloudError, ServiceUnavailableError

    text = str(e)
    if isinstance(e, RateLimitReachedError | ServiceUnavailableError):
        return Transient(f"libcloud: {text} (temporary: retried with backoff)")
    if isinstance(e, InvalidCredsError):
        return Fatal(f"libcloud: {text} (check the environment variables the pool's credentials name)")
    if any(w in text.lower() for w in CAPACITY_WORDS):
        return NoCapacity(f"libcloud: {text} (no capacity here now: another pool will be tried)")
    if isinstance(e, LibcloudError):
        return Fatal(f"libcloud: {text} (check the pool's instance_type, image and options)")
    return e


class LibcloudProvider:
    name = "libcloud"

    def __init__(self, driver: Any, sizes: dict[str, list[Any]], image: str | None = None,
                 zone: str | None = None) -> None:
        self.driver, self.sizes, self.image, self.zone = driver, sizes, image, zone

    @classmethod
    def from_config(cls, driver: str, credentials: str | None, args: list[Any], kwargs: dict[str, Any],
                    sizes: dict[str, list[Any]], image: str | None, zone: str | None) -> LibcloudProvider:
        from libcloud.compute.providers import get_driver
        from libcloud.compute.types import Provider as LP

        secrets: list[str] = []
        if credentials:
            if not credentials.startswith("env:"):
                raise Fatal("libcloud credentials must name environment variables: env:KEY_VAR,SECRET_VAR")
            for var in credentials[4:].split(","):
                if var.strip() not in os.environ:
                    raise Fatal(f"libcloud credentials: environment variable {var.strip()} is not set")
                secrets.append(os.environ[var.strip()])
        try:
            cls_ = get_driver(getattr(LP, driver.upper()))
        except AttributeError:
            raise Fatal(f"libcloud has no compute driver {driver!r} (see libcloud.compute.types.Provider)"
                        ) from None
        return cls(cls_(*secrets, *args, **kwargs), sizes, image, zone)

    def _call(self, fn: Any, *a: Any, **kw: Any) -> Any:
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.types import LibcloudError

        try:
            return fn(*a, **kw)
        except (LibcloudError, BaseHTTPError, OSError) as e:
            raise map_error(e) from e

    @retrying
    def offers(self) -> list[Offer]:
        out = []
        for sz in self._call(self.driver.list_sizes):
            gpu = self.sizes.get(sz.id)
            if gpu:
                out.append(Offer("libcloud", self.zone or "", self.zone or "", sz.id, gpu[0], int(gpu[1]),
                                 "on_demand", sz.price))
        return out

    def _nodes(self) -> list[Any]:
        return self._call(self.driver.list_nodes)

    @retrying
    def launch(self, req: LaunchRequest) -> Instance:
        for n in self._nodes():
            if n.name == req.node_id and _state(n) != InstanceState.GONE:
                return _instance(n)
        size = next((s for s in self._call(self.driver.list_sizes) if s.id == req.instance_type), None)
        if size is None:
            raise Fatal(f"libcloud: no size {req.instance_type!r} (check the pool's instance_type)")
        images = self._call(self.driver.list_images)
        image = next((i for i in images if i.id == (req.image or self.image)), images[0] if images else None)
        kw: dict[str, Any] = {"name": req.node_id, "size": size, "image": image, "ex_metadata": req.tags()}
        return _instance(self._call(self.driver.create_node, **kw))

    @retrying
    def terminate(self, instance_id: str) -> None:
        for n in self._nodes():
            if n.id == instance_id and _state(n) != InstanceState.GONE:
                self._call(self.driver.destroy_node, n)

    @retrying
    def poll(self, broker_id: str) -> list[Instance]:
        return sorted((_instance(n) for n in self._nodes() if _state(n) != InstanceState.GONE
                       and _tags(n).get(TAG_BROKER) == broker_id), key=lambda i: i.instance_id)

    @retrying
    def describe(self, instance_id: str) -> Instance | None:
        for n in self._nodes():
            if n.id == instance_id and _state(n) != InstanceState.GONE:
                return _instance(n)
        return None

    def interruptions(self) -> list[Interruption]:
        return []  # libcloud drivers expose no interruption channel

    def ack(self, notices: list[Interruption]) -> None:
        return None  # nothing to acknowledge


def _tags(n: Any) -> dict[str, str]:
    tags = dict(n.extra.get("tags") or n.extra.get("metadata") or {})
    tags.setdefault(TAG_NODE, n.name)
    return tags


def _state(n: Any) -> InstanceState:
    from libcloud.compute.types import NodeState as S

    return {S.RUNNING: InstanceState.RUNNING, S.PENDING: InstanceState.PENDING,
            S.STARTING: InstanceState.PENDING, S.REBOOTING: InstanceState.PENDING,
            S.STOPPING: InstanceState.STOPPING, S.STOPPED: InstanceState.GONE,
            S.TERMINATED: InstanceState.GONE}.get(n.state, InstanceState.PENDING)


def _instance(n: Any) -> Instance:
    return Instance(n.id, _state(n), _tags(n), n.extra.get("zone"), "on_demand")

"""One harness per provider for the contract suite: build it, and make its next calls fail
with the backend's own native errors (so the mapping is what is tested)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from providers.base import LaunchRequest, Provider

BROKER = "op-test"
BOOT = "#!/bin/bash\necho onepool boot script\n"


def request(node: str = "pool-a-0001", token: str = "tok-0001", job: int | None = 7,
            broker: str = BROKER, **kw: Any) -> LaunchRequest:
    base: dict[str, Any] = dict(token=token, broker_id=broker, pool="pool-a", node_id=node, job_id=job,
                                instance_type="g5.xlarge", market="spot", user_data=BOOT)
    return LaunchRequest(**{**base, **kw})


@dataclass
class Harness:
    name: str
    provider: Provider
    # fail(kind, times): the next `times` launch calls fail natively; kind in `kinds`
    fail: Callable[[str, int], None] | None = None
    kinds: frozenset[str] = field(default_factory=frozenset)
    instance_type: str = "g5.xlarge"
    # notify(instance_id): the cloud sends an interruption notice for it (None: no channel)
    notify: Callable[[str], None] | None = None
    market: str = "spot"
    # what the instance boots: instance id -> its boot script (None: not readable here)
    boot_script: Callable[[str], str | None] | None = None
    # the market the cloud says an instance runs on (None: the cloud does not say)
    market_of: Callable[[str], str | None] | None = None

    def req(self, **kw: Any) -> LaunchRequest:
        """A launch request this provider can serve (its instance type and market)."""
        return request(**{"instance_type": self.instance_type, "market": self.market, **kw})


def failing(real: Callable[..., Any], make_error: Callable[[], Exception], times: int) -> Callable[..., Any]:
    """`real`, except that its first `times` calls raise make_error()."""
    left = [times]

    def call(*a: Any, **kw: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise make_error()
        return real(*a, **kw)

    return call

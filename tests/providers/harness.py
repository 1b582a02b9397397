"""One harness per provider for the contract suite: build it, and make its next calls fail
with the backend's own native errors (so the mapping is what is tested)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from providers.base import LaunchRequest, Provider

BROKER = "op-test"


def request(node: str = "pool-a-0001", token: str = "tok-0001", job: int | None = 7,
            broker: str = BROKER, **kw: Any) -> LaunchRequest:
    base: dict[str, Any] = dict(token=token, broker_id=broker, pool="pool-a", node_id=node, job_id=job,
                                instance_type="g5.xlarge", market="spot", user_data="#!/bin/bash\n")
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


def failing(real: Callable[..., Any], make_error: Callable[[], Exception], times: int) -> Callable[..., Any]:
    """`real`, except that its first `times` calls raise make_error()."""
    left = [times]

    def call(*a: Any, **kw: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise make_error()
        return real(*a, **kw)

    return call

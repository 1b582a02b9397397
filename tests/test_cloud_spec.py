"""Rented pools in onepool.yaml: what is required, and clear errors; providers built from it."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import SpecError
from broker.spec import parse_config
from providers.base import Fatal
from providers.registry import make_provider


def cfg(**pool: Any) -> dict[str, Any]:
    base = {"name": "spot", "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
            "max_nodes": 2, "market": "spot", "region": "us-east-1", "instance_type": "g5.12xlarge"}
    return {"pools": [{**base, **pool}], "teams": [{"name": "t"}],
            "broker": {"server_url": "http://10.0.0.5:8421"}}


@pytest.mark.parametrize(("pool", "needle"), [
    ({"max_nodes": None}, "needs max_nodes and instance_type"),
    ({"instance_type": None}, "needs max_nodes and instance_type"),
    ({"market": "onprem"}, "on_demand or spot"),
    ({"nodes": 3}, "must be 0 for a rented pool"),
    ({"provider": "local", "max_nodes": 2}, "only rented pools"),
    ({"provider": "agent", "max_nodes": 2}, "only rented pools"),
])
def test_bad_rented_pools_say_what_to_fix(pool: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_config(cfg(**pool))
    assert needle in str(e.value)


@pytest.mark.parametrize(("pool", "needle"), [
    ({"provider": "gcp", "instance_type": "a2-highgpu-1g"}, "options.project"),
    ({"provider": "libcloud"}, "options.driver"),
    ({"provider": "libcloud", "options": {"driver": "NO_SUCH"}}, "no compute driver"),
    ({"provider": "libcloud", "options": {"driver": "AZURE_ARM"}, "credentials": "env:ONEPOOL_NOPE"},
     "ONEPOOL_NOPE is not set"),
])
def test_providers_that_cannot_be_built_raise_fatal_saying_why(pool: dict[str, Any], needle: str) -> None:
    spec = parse_config(cfg(**pool)).pools[0]
    with pytest.raises(Fatal) as e:
        make_provider(spec)
    assert needle in str(e.value)


@pytest.mark.parametrize(("broker", "needle"), [
    ({}, "broker.server_url: required when a pool rents nodes (spot)"),
    ({"server_url": "10.0.0.5:8421"}, "server_url"),
    ({"server_url": "http://x:1", "agent_heartbeat_s": 20}, "at least 3 x agent_heartbeat_s"),
])
def test_rented_pools_need_a_server_their_agents_reach(broker: dict[str, Any], needle: str) -> None:
    data = cfg()
    data["broker"] = broker
    with pytest.raises(SpecError) as e:
        parse_config(data)
    assert needle in str(e.value)


def test_a_rented_pool_with_max_nodes_admits_multi_node_jobs() -> None:
    from broker.spec import check_job_fits, parse_job

    check_job_fits(parse_job({"name": "j", "team": "t", "command": "x", "nodes": 2, "gpus_per_node": 4}),
                   parse_config(cfg()))

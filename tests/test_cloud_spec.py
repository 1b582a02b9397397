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


GCP = {"provider": "gcp", "instance_type": "n1-standard-8", "gpu_type": "T4", "region": "us-central1"}
AZURE = {"provider": "libcloud", "market": "on_demand", "instance_type": "Standard_NC4as_T4_v3"}


@pytest.mark.parametrize(("pool", "needle"), [
    ({"provider": "gcp", "instance_type": "a2-highgpu-1g"}, "options.project: Field required"),
    ({"provider": "libcloud"}, "options.driver: Field required"),
    # AWS options
    ({"options": {"subnet_ids": ["subnet-1"]}},
     "options.subnet_ids.0: must be subnet ids like subnet-0123456789abcdef0 (got 'subnet-1')"),
    ({"options": {"subnet_ids": ["subnet-0123456789abcdef0"] * 2}}, "subnet_ids: listed twice"),
    ({"options": {"security_group_ids": ["default"]}},
     "options.security_group_ids.0: must be security group"),
    ({"options": {"root_volume_gb": 4}},
     "options.root_volume_gb: Input should be greater than or equal to 8"),
    ({"options": {"instance_profile": "arn:aws:iam::12:role/x"}}, "options.instance_profile: must be"),
    ({"options": {"subnet": "subnet-0123456789abcdef0"}}, "options.subnet: unknown option"),
    ({"zone": "us-east-1a", "options": {"subnet_ids": ["subnet-0123456789abcdef0"]}},
     "zone: a pool with options.subnet_ids launches in its subnets' zones"),
    ({"image": "ubuntu-22.04"}, "image: must be an AMI id (ami-0123456789abcdef0) or an SSM parameter"),
    # GCP options
    ({**GCP, "options": {"project": "p", "zones": ["europe-west4-a"]}},
     "zone 'europe-west4-a' is not in the pool's region 'us-central1'"),
    ({**GCP, "zone": "us-central1-a", "options": {"project": "p", "zones": ["us-central1-b"]}},
     "set options.zones (several, tried in order) or zone, not both"),
    ({**GCP, "gpu_type": "MI300X", "options": {"project": "p"}},
     "options.accelerator_type: n1-standard-8 carries no GPUs and gpu_type 'MI300X'"),
    ({**GCP, "options": {"project": "p", "scopes": ["storage"]}},
     "options.scopes.0: must be OAuth scope URLs"),
    ({**GCP, "image": "ubuntu-2204", "options": {"project": "p"}},
     "image: must be projects/PROJECT/global/images/family/FAMILY"),
    # libcloud options
    ({**AZURE, "market": "spot", "options": {"driver": "AZURE_ARM"}},
     "market: libcloud's azure_arm driver has no spot option; use market: on_demand "
     "(drivers with spot: ec2)"),
    ({**AZURE, "options": {"driver": "AZURE_ARM", "create_node": {"name": "x", "image": "y"}}},
     "options.create_node: image, name are set by onepool"),
    ({**AZURE, "name": "gpu.t4", "options": {"driver": "VULTR"}},
     "name: libcloud's vultr driver keeps no tags"),
    ({**AZURE, "options": {"driver": "AZURE_ARM", "auth": {}}},
     "options.auth: set exactly one of ssh_key, ssh_key_file, password_env"),
])
def test_bad_cloud_options_say_what_to_fix(pool: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_config(cfg(**pool))
    assert needle in str(e.value)


def test_gcp_labels_must_tell_pools_apart() -> None:
    """'.' is not allowed in a GCP label value: pool `spot.x` is labelled `spot-x`."""
    data = cfg(**GCP, options={"project": "p"})
    data["pools"] = [{**data["pools"][0], "name": n} for n in ("spot.x", "spot_x")]
    assert [p.name for p in parse_config(data).pools] == ["spot.x", "spot_x"]
    data["pools"][1]["name"] = "spot-x"
    with pytest.raises(SpecError) as e:
        parse_config(data)
    assert "GCP label values cannot tell pools 'spot.x' and 'spot-x' apart (both become 'spot-x')" \
        in str(e.value)


@pytest.mark.parametrize(("pool", "needle"), [
    ({"provider": "libcloud", "options": {"driver": "NO_SUCH"}}, "no compute driver"),
    ({**AZURE, "options": {"driver": "AZURE_ARM"}, "credentials": "env:ONEPOOL_NOPE"},
     "ONEPOOL_NOPE is not set"),
    ({**AZURE, "options": {"driver": "AZURE_ARM"}, "credentials": "env:HOME,HOME"},
     "cannot build the driver (missing a required argument: 'tenant_id')"),
])
def test_providers_that_cannot_be_built_raise_fatal_saying_why(pool: dict[str, Any], needle: str) -> None:
    spec = parse_config(cfg(**pool)).pools[0]
    with pytest.raises(Fatal) as e:
        make_provider(spec)
    assert needle in str(e.value)


@pytest.mark.parametrize(("broker", "needle"), [
    ({}, "broker.server_url: required when a pool rents nodes (spot)"),
    ({"server_url": "10.0.0.5:8421"}, "server_url"),
    ({"server_url": "http://x:1", "agent_heartbeat_s": 20, "node_lost_after_s": 50},
     "at least 3 x agent_heartbeat_s"),
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

"""End to end, per provider: the broker rents a spot node (on-demand for Azure, whose libcloud
driver has no spot), the instance boots the user data the provider passed (the GCE
startup-script, libcloud's driver argument), its `onepool agent` joins the API server, and the
job runs there and succeeds. (AWS: tests/test_cloud_engine.py's first test does the same with
EC2 user data on moto, and tests/agents/test_cloud_agents.py goes on to notices and lost agents.)

The clouds are the Compute fake (through the real google-cloud-compute client, the provider
built from onepool.yaml by the registry) and libcloud drivers (a fake with EC2's signatures;
the real Azure ARM driver over a fake Resource Manager). One InstanceBooter boots every cloud,
moto's EC2 included, through a BootSource per cloud."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from libcloud.compute.drivers.ec2 import EC2NodeDriver
from sqlmodel import select

from broker.client.demo_instances import BootSource, GceInstances, InstanceBooter, LibcloudNodes
from broker.state.model import Attempt, Node
from providers.base import Provider
from tests.agents.harness import Site, make_site
from tests.conftest import drive, kill_leftovers, train

pytestmark = pytest.mark.e2e
BASE = {"name": "rented", "gpus_per_node": 2, "nodes": 0, "max_nodes": 1, "market": "spot",
        "price_per_node_hour": 2.0, "launch_latency_s": 0, "idle_timeout_s": 0,
        "interruption_rate_per_h": 0.01}


Cloud = tuple[dict[str, Any], BootSource, Provider | None]  # the pool, how to boot, a prebuilt provider


def gcp(tmp_path: Path, request: pytest.FixtureRequest) -> Cloud:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    url, _ = request.getfixturevalue("gcp_fake")
    pool = {**BASE, "provider": "gcp", "gpu_type": "T4", "region": "us-central1",
            "instance_type": "n1-standard-8",
            "endpoint_url": url, "options": {"project": "p", "zones": ["us-central1-a", "us-central1-b"]}}
    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest",
                                        client_options=ClientOptions(api_endpoint=url))
    return pool, GceInstances(client, "p"), None


def libcloud_ec2(tmp_path: Path, request: pytest.FixtureRequest) -> Cloud:
    from tests.providers.libcloud_fake import libcloud_provider, signature_fake

    drv = signature_fake(EC2NodeDriver)
    pool = {**BASE, "provider": "libcloud", "gpu_type": "A10G", "instance_type": "g5.xlarge",
            "options": {"driver": "EC2"}}
    source = LibcloudNodes(drv, lambda n: drv.cloud.created[n.id]["ex_userdata"])
    return pool, source, libcloud_provider(drv, pool="rented")


def libcloud_azure(tmp_path: Path, request: pytest.FixtureRequest) -> Cloud:
    from tests.providers.azure_fake import AZURE_IMAGE, AZURE_OPTIONS, azure_driver
    from tests.providers.libcloud_fake import libcloud_provider

    drv, arm = azure_driver()
    pool = {**BASE, "provider": "libcloud", "market": "on_demand", "gpu_type": "A100",
            "instance_type": "Standard_NC24ads_A100_v4", "options": {"driver": "AZURE_ARM"}}

    def custom_data(n: Any) -> str:
        return base64.b64decode(arm.bodies[n.id]["properties"]["osProfile"]["customData"]).decode()

    return pool, LibcloudNodes(drv, custom_data), libcloud_provider(drv, pool="rented", image=AZURE_IMAGE,
                                                                   **AZURE_OPTIONS)


CLOUDS: dict[str, Callable[..., Cloud]] = {"gcp": gcp, "libcloud-ec2": libcloud_ec2,
                                           "libcloud-azure": libcloud_azure}


@pytest.fixture(params=list(CLOUDS))
def cloud(request: pytest.FixtureRequest, tmp_path: Path, clock) -> Iterator[tuple[Site, str]]:  # type: ignore[no-untyped-def]
    pool, source, provider = CLOUDS[request.param](tmp_path, request)
    site = make_site(tmp_path / "home", clock, pools=[pool], cloud_after_wait_s=0, node_lost_after_s=6,
                     agent_heartbeat_s=1)
    if provider is not None:  # a fake driver object: not something onepool.yaml can name
        site.engine.capacity.providers["rented"] = provider
    with InstanceBooter(source, tmp_path / "instances") as booter:
        yield site, request.param
        c = site.client
        for j in c.list(status=["PENDING", "RUNNING"]):
            c.cancel(j.id)
        drive(site.engine, lambda: not c.list(status=["PENDING", "RUNNING"])
              and all(n.state == "terminated" for n in _nodes(site)), timeout=60)
        booter.tick()  # one scan of the cloud now, not at the booter's next poll
        assert booter.booted == {}  # the instance went, and its agent with it
    site.close()  # the engine's cloud workers too, not only the API
    kill_leftovers(tmp_path / "home" / "runs")


def _nodes(site: Site) -> list[Node]:
    with site.client.store.session() as s:
        return list(s.exec(select(Node).where(Node.pool == "rented")).all())


def test_a_rented_node_boots_its_user_data_and_its_agent_runs_the_job(cloud: tuple[Site, str]) -> None:
    site, _ = cloud
    c = site.client
    j = c.submit(name="sweep", team="research", command=train(6), gpus_per_node=2, priority="low").id
    drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=90)
    [joined] = [e for e in c.events() if e.kind == "agent_joined"]
    assert joined.data["agent"]["booted_from_user_data"] is True
    [node] = _nodes(site)
    assert joined.data.get("node", node.id) == node.id and node.instance_id
    with c.store.session() as s:
        [att] = s.exec(select(Attempt).where(Attempt.job_id == j)).all()
    assert att.pool == "rented" and att.handles[0]["kind"] == "agent"  # it ran through that agent

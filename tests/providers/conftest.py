"""Harness fixtures: local, AWS (moto), GCP (the REST fake in tests/providers/gcp_fake.py),
libcloud (a fake with EC2NodeDriver's signatures, tests/providers/libcloud_fake.py) and
libcloud's real Azure ARM driver over a fake Resource Manager (tests/providers/azure_fake.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from providers.local_nodes import LocalNodes
from providers.retry import ATTEMPTS
from tests.providers.aws_faults import Ec2Faults, instant_backoff
from tests.providers.harness import Harness

# botocore retries 5xx answers itself: a capacity error (EC2 answers it with HTTP 500) must
# come back on every attempt to reach the provider.
AWS_ERRORS = {"capacity": ("InsufficientInstanceCapacity", 500, ATTEMPTS),
              "quota": ("MaxSpotInstanceCountExceeded", 400, 1),
              "throttle": ("RequestLimitExceeded", 503, 1), "fatal": ("AuthFailure", 401, 1)}


def local_harness(tmp_path: Path) -> Harness:
    prov = LocalNodes(tmp_path / "nodes.json", "A10G", 1)

    def fail(kind: str, times: int) -> None:  # this machine only ever runs out of slots
        prov.limit = 0

    return Harness("local", prov, fail, frozenset({"capacity"}), notify=prov.interrupt)


def aws_harness(region: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    import boto3

    from providers.aws import AwsProvider
    from providers.options import AwsOptions

    instant_backoff(monkeypatch)
    sqs = boto3.client("sqs", region_name=region)
    queue = sqs.create_queue(QueueName="notices", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    prov = AwsProvider(region, image="ami-12345678", options=AwsOptions(queue_url=queue))
    faults = Ec2Faults(prov.ec2)

    def notify(instance_id: str) -> None:
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({
            "detail-type": "EC2 Spot Instance Interruption Warning", "time": "2026-12-02T10:00:00Z",
            "detail": {"instance-id": instance_id, "instance-action": "terminate"}}))

    def fail(kind: str, times: int) -> None:
        code, status, per_launch = AWS_ERRORS[kind]
        faults.add(code, status, times * per_launch)

    def user_data(iid: str) -> str:
        raw = prov.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
        return base64.b64decode(raw["UserData"]["Value"]).decode()

    def market(iid: str) -> str:
        [res] = prov.ec2.describe_instances(InstanceIds=[iid])["Reservations"]
        return "spot" if res["Instances"][0].get("InstanceLifecycle") == "spot" else "on_demand"

    return Harness("aws", prov, fail, frozenset(AWS_ERRORS), boot_script=user_data, market_of=market,
                   notify=notify)


def azure_harness() -> Harness:
    from tests.providers.azure_fake import AZURE_IMAGE, AZURE_OPTIONS, azure_driver
    from tests.providers.libcloud_fake import libcloud_provider

    drv, arm = azure_driver()
    errors = {"capacity": (409, "AllocationFailed"), "quota": (409, "OperationNotAllowed: quota exceeded"),
              "throttle": (429, "TooManyRequests"), "fatal": (401, "InvalidAuthenticationToken")}

    def fail(kind: str, times: int) -> None:
        arm.fail.extend([errors[kind]] * times)

    def custom_data(iid: str) -> str:
        return base64.b64decode(arm.bodies[iid]["properties"]["osProfile"]["customData"]).decode()

    prov = libcloud_provider(drv, **{**AZURE_OPTIONS, "image": AZURE_IMAGE})
    return Harness("libcloud-azure", prov, fail, frozenset(errors), instance_type="Standard_NC24ads_A100_v4",
                   market="on_demand", boot_script=custom_data)


@pytest.fixture(params=["local", "aws", "gcp", "libcloud", "libcloud-azure"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if request.param == "local":
        return local_harness(tmp_path)
    if request.param == "aws":
        return aws_harness(request.getfixturevalue("aws_mock"), request.getfixturevalue("monkeypatch"))
    if request.param == "gcp":
        from tests.providers.gcp_fake import gcp_harness

        return gcp_harness(request.getfixturevalue("gcp_fake"))
    if request.param == "libcloud-azure":
        return azure_harness()
    from tests.providers.libcloud_fake import libcloud_harness

    return libcloud_harness()

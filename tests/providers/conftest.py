"""Harness fixtures: local, AWS (moto), GCP (the REST fake in tests/providers/gcp_fake.py),
libcloud (the fake driver in tests/providers/libcloud_fake.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from providers.local_nodes import LocalNodes
from tests.providers.harness import Harness, failing

AWS_ERRORS = {"capacity": ("InsufficientInstanceCapacity", 500),
              "quota": ("MaxSpotInstanceCountExceeded", 400),
              "throttle": ("RequestLimitExceeded", 503), "fatal": ("AuthFailure", 401)}


def local_harness(tmp_path: Path) -> Harness:
    prov = LocalNodes(tmp_path / "nodes.json", "A10G", 1)

    def fail(kind: str, times: int) -> None:  # this machine only ever runs out of slots
        prov.limit = 0

    return Harness("local", prov, fail, frozenset({"capacity"}), notify=prov.interrupt)


def aws_harness(region: str) -> Harness:
    import boto3
    from botocore.exceptions import ClientError

    from providers.aws import AwsProvider

    sqs = boto3.client("sqs", region_name=region)
    queue = sqs.create_queue(QueueName="notices", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    prov = AwsProvider(region, image="ami-12345678", queue_url=queue)

    def notify(instance_id: str) -> None:
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({
            "detail-type": "EC2 Spot Instance Interruption Warning", "time": "2026-12-02T10:00:00Z",
            "detail": {"instance-id": instance_id, "instance-action": "terminate"}}))

    def fail(kind: str, times: int) -> None:
        code, status = AWS_ERRORS[kind]
        err = {"Error": {"Code": code, "Message": f"simulated {code}"},
               "ResponseMetadata": {"HTTPStatusCode": status}}
        prov.ec2.run_instances = failing(prov.ec2.run_instances,  # type: ignore[method-assign]
                                         lambda: ClientError(err, "RunInstances"), times)

    return Harness("aws", prov, fail, frozenset(AWS_ERRORS), notify=notify)


@pytest.fixture(params=["local", "aws", "gcp", "libcloud"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if request.param == "local":
        return local_harness(tmp_path)
    if request.param == "aws":
        return aws_harness(request.getfixturevalue("aws_mock"))
    if request.param == "gcp":
        from tests.providers.gcp_fake import gcp_harness

        return gcp_harness(request.getfixturevalue("gcp_fake"))
    from tests.providers.libcloud_fake import libcloud_harness

    return libcloud_harness()

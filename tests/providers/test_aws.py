"""AWS launches a cloud engineer would accept (moto's EC2, SSM and IAM; botocore's Stubber for
real spot price records): instance profile, subnets tried in order, security groups, root
volume, images from SSM, IMDSv2, one retry layer, spot prices from a start time, paged, per AZ."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from providers.aws import AwsProvider
from providers.base import Fatal, NoCapacity, Transient
from providers.options import AwsOptions
from providers.retry import ATTEMPTS
from tests.providers.aws_faults import Ec2Faults, instant_backoff
from tests.providers.harness import request

AMI = "ami-12345678"
AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-6.1-x86_64"  # a public parameter moto knows


def provider(region: str, image: str = AMI, **options: Any) -> AwsProvider:
    return AwsProvider(region, options=AwsOptions.model_validate(options), image=image)


def described(p: AwsProvider, iid: str) -> dict[str, Any]:
    [res] = p.ec2.describe_instances(InstanceIds=[iid])["Reservations"]
    return dict(res["Instances"][0])


def subnets(region: str, n: int) -> list[str]:
    ec2 = boto3.client("ec2", region_name=region)
    found = sorted(ec2.describe_subnets()["Subnets"], key=lambda s: s["AvailabilityZone"])
    return [s["SubnetId"] for s in found][:n]


def test_a_node_gets_its_role_its_network_imdsv2_and_a_spot_market(aws_mock: str) -> None:
    ec2 = boto3.client("ec2", region_name=aws_mock)
    iam = boto3.client("iam", region_name=aws_mock)
    iam.create_instance_profile(InstanceProfileName="onepool-node")
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    sg = ec2.create_security_group(GroupName="onepool-nodes", Description="egress only", VpcId=vpc)["GroupId"]
    [subnet] = subnets(aws_mock, 1)
    p = provider(aws_mock, instance_profile="onepool-node", subnet_ids=[subnet], security_group_ids=[sg])
    inst = p.launch(request())
    d = described(p, inst.instance_id)
    assert d["IamInstanceProfile"]["Arn"].endswith(":instance-profile/onepool-node")
    assert d["SubnetId"] == subnet and [g["GroupId"] for g in d["SecurityGroups"]] == [sg]
    assert d["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only
    assert d["MetadataOptions"]["HttpPutResponseHopLimit"] == 2  # containers on the node reach it
    assert d["InstanceLifecycle"] == "spot"
    p.terminate(inst.instance_id)


def test_an_instance_profile_may_be_given_by_arn(aws_mock: str) -> None:
    arn = boto3.client("iam", region_name=aws_mock).create_instance_profile(
        InstanceProfileName="onepool-node")["InstanceProfile"]["Arn"]
    p = provider(aws_mock, instance_profile=arn)
    inst = p.launch(request())
    assert described(p, inst.instance_id)["IamInstanceProfile"]["Arn"] == arn
    p.terminate(inst.instance_id)


def test_a_capacity_error_in_one_subnet_passes_the_launch_to_the_next(aws_mock: str, monkeypatch) -> None:
    instant_backoff(monkeypatch)
    first, second = subnets(aws_mock, 2)
    p = provider(aws_mock, subnet_ids=[first, second])
    faults = Ec2Faults(p.ec2)
    faults.add("InsufficientInstanceCapacity", 500, ATTEMPTS)  # every attempt in the first subnet
    inst = p.launch(request())
    assert described(p, inst.instance_id)["SubnetId"] == second
    assert p.launch(request()).instance_id == inst.instance_id  # the retry finds it by its node tag
    p.terminate(inst.instance_id)
    faults.add("InsufficientInstanceCapacity", 500, 2 * ATTEMPTS)
    with pytest.raises(NoCapacity) as e:
        p.launch(request(node="pool-a-0002", token="tok-0002"))
    assert first in str(e.value) and second in str(e.value)


def test_root_volume_size_applies_to_the_images_root_device(aws_mock: str) -> None:
    ec2 = boto3.client("ec2", region_name=aws_mock)
    ami = ec2.register_image(Name="dlami", RootDeviceName="/dev/sda1", BlockDeviceMappings=[
        {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 75}}])["ImageId"]
    p = provider(aws_mock, image=ami, root_volume_gb=500)
    inst = p.launch(request())
    [mapping] = described(p, inst.instance_id)["BlockDeviceMappings"]
    assert mapping["DeviceName"] == "/dev/sda1"
    [vol] = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"]
    assert (vol["Size"], vol["VolumeType"], vol["Encrypted"]) == (500, "gp3", True)
    p.terminate(inst.instance_id)
    with pytest.raises(Fatal, match="image ami-0000000000000000 does not exist in us-east-1"):
        provider(aws_mock, image="ami-0000000000000000", root_volume_gb=500).launch(request(node="n2"))


def test_an_ssm_image_is_resolved_at_launch(aws_mock: str) -> None:
    ami = boto3.client("ssm", region_name=aws_mock).get_parameter(Name=AL2023)["Parameter"]["Value"]
    p = provider(aws_mock, image=f"resolve:ssm:{AL2023}")
    inst = p.launch(request())
    assert described(p, inst.instance_id)["ImageId"] == ami
    p.terminate(inst.instance_id)
    missing = "/aws/service/deeplearning/ami/x86_64/no-such-ami/latest/ami-id"
    with pytest.raises(Fatal, match=f"the SSM parameter {missing} does not exist in us-east-1"):
        provider(aws_mock, image=f"resolve:ssm:{missing}").launch(request(node="n2"))


def test_botocore_is_the_one_retry_layer(aws_mock: str, monkeypatch) -> None:
    """Throttling is retried by botocore's adaptive mode, ATTEMPTS attempts with growing
    backoff, and by nothing on top of it."""
    slept = instant_backoff(monkeypatch)
    p = provider(aws_mock)
    assert p.ec2.meta.config.retries == {"mode": "adaptive", "total_max_attempts": ATTEMPTS}
    faults = Ec2Faults(p.ec2)
    faults.add("RequestLimitExceeded", 503, 100)
    with pytest.raises(Transient, match="RequestLimitExceeded"):
        p.launch(request())
    assert faults.attempts == ATTEMPTS  # not ATTEMPTS x another layer's attempts
    assert len(slept) == ATTEMPTS - 1 and all(s > 0 for s in slept)


def spot_record(t: str, zone: str | None, zone_id: str | None, price: str, ts: datetime) -> dict[str, Any]:
    r: dict[str, Any] = {"InstanceType": t, "ProductDescription": "Linux/UNIX", "SpotPrice": price,
                         "Timestamp": ts}
    if zone:
        r["AvailabilityZone"] = zone
    if zone_id:
        r["AvailabilityZoneId"] = zone_id
    return r


def test_spot_prices_come_from_a_start_time_every_page_and_every_az_with_its_id() -> None:
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    p = AwsProvider("us-east-1", now=lambda: now.timestamp())
    t0, t1 = datetime(2026, 12, 3, 11, 10, tzinfo=UTC), datetime(2026, 12, 3, 11, 40, tzinfo=UTC)
    with Stubber(p.ec2) as stub:
        stub.add_response("describe_instance_types", {"InstanceTypes": [
            {"InstanceType": "g5.xlarge", "GpuInfo": {"Gpus": [{"Name": "A10G", "Count": 1}]}},
            {"InstanceType": "m5.large"}]}, {})
        stub.add_response("describe_availability_zones", {"AvailabilityZones": [
            {"ZoneName": "us-east-1a", "ZoneId": "use1-az6"},
            {"ZoneName": "us-east-1b", "ZoneId": "use1-az1"}]}, {})
        base = {"InstanceTypes": ["g5.xlarge"], "ProductDescriptions": ["Linux/UNIX"],
                "StartTime": datetime(2026, 12, 3, 11, 0, tzinfo=UTC), "MaxResults": 1000}
        stub.add_response("describe_spot_price_history", {"NextToken": "page-2", "SpotPriceHistory": [
            spot_record("g5.xlarge", "us-east-1a", None, "0.4000", t0),
            spot_record("g5.xlarge", "us-east-1b", "use1-az1", "0.5100", t0)]}, base)
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
            spot_record("g5.xlarge", "us-east-1a", "use1-az6", "0.4400", t1),  # newer: wins
            spot_record("g5.xlarge", None, "use1-az1", "0.3900", t0.replace(minute=5))]},  # older: loses
            {**base, "NextToken": "page-2"})
        offers = p.offers()
        stub.assert_no_pending_responses()
    assert [(o.market, o.zone, o.zone_id, o.usd_per_hour) for o in offers] == [
        ("on_demand", "", None, None),
        ("spot", "us-east-1a", "use1-az6", 0.44),
        ("spot", "us-east-1b", "use1-az1", 0.51)]

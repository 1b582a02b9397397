"""AWS EC2: on-demand and spot nodes, tagged, idempotent, reconciled (the Provider contract).

- offers(): GPU instance types from describe_instance_types (GpuInfo), priced per AZ by the
  spot price history (providers.aws.prices; on-demand prices come from the catalog).
- launch(): run_instances with
  - ClientToken derived from the broker's token; before calling, it looks for an instance
    already tagged with the node id (a launch whose answer was lost), so the token's
    24-hour window is not the only guard;
  - the pool's subnets tried in order (options.subnet_ids): a capacity error in one
    (InsufficientInstanceCapacity, ...) passes the launch to the next, each with its own
    derived token; security groups, the instance profile (the node's credentials for its
    S3 checkpoint store), a gp3 root volume of options.root_volume_gb, encrypted;
  - the image: an AMI id, or `resolve:ssm:/...` (a public SSM parameter such as the Deep
    Learning AMI's, resolved at each launch, so new nodes get the current AMI); the default
    is the Deep Learning Base OSS NVIDIA Driver AMI (Ubuntu 22.04);
  - IMDSv2 required (HttpTokens=required), hop limit 2 so containers on the node reach it;
  - spot: one-time, terminate on interruption; tags on the instance, its volumes and its
    spot request; the bootstrap user data (providers.bootstrap).
- interruptions(): "EC2 Spot Instance Interruption Warning" and "EC2 Instance Rebalance
  Recommendation" events delivered by an EventBridge rule to an SQS queue (queue_url;
  infra/aws creates both). A notice stays in the queue until the broker has recorded it and
  ack()s it (at-least-once; each carries its message id as its key).
- describe(): one instance by id (the broker confirms a node lost, or terminated, with it).
- Retries: botocore's adaptive retry mode is the single retry layer (client_config); nothing
  here retries again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from providers.aws.errors import mapped
from providers.aws.prices import spot_quotes, zone_ids
from providers.aws.session import new_session
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
)
from providers.options import AwsOptions
from providers.retry import ATTEMPTS

STATES = {"pending": InstanceState.PENDING, "running": InstanceState.RUNNING,
          "stopping": InstanceState.STOPPING, "stopped": InstanceState.STOPPING,
          "shutting-down": InstanceState.GONE, "terminated": InstanceState.GONE}
EVENTS = {"EC2 Spot Instance Interruption Warning": "spot_interruption",
          "EC2 Instance Rebalance Recommendation": "rebalance"}
DEFAULT_IMAGE = ("resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
                 "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
SSM_PREFIX = "resolve:ssm:"
IMDS = {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"}
MAX_RECEIVES = 20  # receive calls per interruptions(): at most 200 notices, then the next round


def client_config(connect_timeout_s: float = 5.0, read_timeout_s: float = 20.0) -> Any:
    """botocore's adaptive retries (backoff with jitter, plus client-side rate limiting after
    throttling), ONEPOOL_PROVIDER_RETRIES attempts in all; the timeouts bound a hung call
    (the pool's options connect_timeout_s, read_timeout_s)."""
    from botocore.config import Config

    return Config(retries={"mode": "adaptive", "total_max_attempts": ATTEMPTS},
                  connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
                  user_agent_extra="onepool")


class AwsProvider:
    """One pool's EC2 region (and its interruption queue). `session` is a boto3 Session (a
    profile named by the pool's `credentials`); endpoint_url points at moto in tests/demo;
    `now` is the clock for the spot price look-back."""

    name = "aws"

    def __init__(self, region: str, *, session: Any = None, endpoint_url: str | None = None,
                 options: AwsOptions | None = None, image: str | None = None,
                 instance_types: list[str] | None = None, now: Callable[[], float] = time.time) -> None:
        self.session = session or new_session()
        self.opts = options or AwsOptions()
        self._kw: dict[str, Any] = {"region_name": region, "config": client_config(
            self.opts.connect_timeout_s, self.opts.read_timeout_s)}
        if endpoint_url:
            self._kw["endpoint_url"] = endpoint_url
        self.region = region
        self.ec2 = self.session.client("ec2", **self._kw)
        self.sqs = self.session.client("sqs", **self._kw) if self.opts.queue_url else None
        self._ssm: Any = None
        self.image = image or DEFAULT_IMAGE
        self.instance_types = instance_types
        self.now = now
        self._root_devices: dict[str, str] = {}

    # -- offers ---------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """GPU instance types (GpuInfo), with the newest spot price per type and AZ."""
        kw: dict[str, Any] = {}
        if self.instance_types:
            kw["InstanceTypes"] = self.instance_types
        types: dict[str, tuple[str, int]] = {}
        with mapped():
            for page in self.ec2.get_paginator("describe_instance_types").paginate(**kw):
                for it in page["InstanceTypes"]:
                    gpus = it.get("GpuInfo", {}).get("Gpus", [])
                    if gpus:
                        types[it["InstanceType"]] = (gpus[0]["Name"], sum(g["Count"] for g in gpus))
        out = [Offer("aws", self.region, "", t, gpu, n, "on_demand", None)
               for t, (gpu, n) in sorted(types.items())]
        for q in spot_quotes(self.ec2, types, self.now(), zone_ids(self.ec2)):
            gpu, n = types[q.instance_type]
            out.append(Offer("aws", self.region, q.zone, q.instance_type, gpu, n, "spot", q.usd_per_hour,
                             zone_id=q.zone_id))
        return out

    def zone_ids(self) -> dict[str, str]:
        """This account's AZ names -> AZ ids in the region (us-east-1a -> use1-az4): names map
        to ids differently per account, and prices are keyed by id (pricing.catalog)."""
        return zone_ids(self.ec2)

    # -- lifecycle ------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Instance:
        existing = self._by_node(req.node_id)
        if existing is not None:
            return existing
        image = self.resolve_image(req.image or self.image)
        base = self._run_args(req, image)
        where: list[dict[str, Any]] = [{"SubnetId": s} for s in self.opts.subnet_ids]
        if not where:
            where = [{"Placement": {"AvailabilityZone": req.zone}} if req.zone else {}]
        refused = []
        for i, place in enumerate(where):
            token = req.token if i == 0 else f"{req.token}-{i}"
            try:
                with mapped():
                    inst = self.ec2.run_instances(ClientToken=token, **base, **place)["Instances"][0]
                return _instance(inst)
            except NoCapacity as e:
                refused.append(f"{place.get('SubnetId', 'the region')}: {e}")
        raise NoCapacity(f"no capacity for {req.instance_type} in any subnet of the pool: "
                         f"{'; '.join(refused)}")

    def _run_args(self, req: LaunchRequest, image: str) -> dict[str, Any]:
        """run_instances arguments shared by every subnet tried."""
        resources = ["instance", "volume"] + (["spot-instances-request"] if req.market == "spot" else [])
        kw: dict[str, Any] = {
            "ImageId": image, "InstanceType": req.instance_type, "MinCount": 1, "MaxCount": 1,
            "UserData": req.user_data, "MetadataOptions": dict(IMDS),
            "TagSpecifications": [{"ResourceType": r, "Tags": [{"Key": k, "Value": v}
                                                               for k, v in req.tags().items()]}
                                  for r in resources],
        }
        o = self.opts
        if o.instance_profile:
            key = "Arn" if o.instance_profile.startswith("arn:") else "Name"
            kw["IamInstanceProfile"] = {key: o.instance_profile}
        if o.security_group_ids:
            kw["SecurityGroupIds"] = list(o.security_group_ids)
        if o.root_volume_gb:
            kw["BlockDeviceMappings"] = [{"DeviceName": self._root_device(image), "Ebs": {
                "VolumeSize": o.root_volume_gb, "VolumeType": "gp3", "DeleteOnTermination": True,
                "Encrypted": True}}]
        if req.market == "spot":
            kw["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        return kw

    def resolve_image(self, image: str) -> str:
        """An AMI id as it is; `resolve:ssm:NAME` -> the AMI id the SSM parameter holds now.
        Raises Fatal when the parameter does not exist in this region."""
        if not image.startswith(SSM_PREFIX):
            return image
        from botocore.exceptions import ClientError

        name = image[len(SSM_PREFIX):]
        if self._ssm is None:
            self._ssm = self.session.client("ssm", **self._kw)
        try:
            with mapped():
                return str(self._ssm.get_parameter(Name=name)["Parameter"]["Value"])
        except Fatal as e:
            if isinstance(e.__cause__, ClientError) and \
                    e.__cause__.response.get("Error", {}).get("Code") == "ParameterNotFound":
                raise Fatal(f"AWS: the SSM parameter {name} does not exist in {self.region} "
                            "(check the pool's image)") from None
            raise

    def _root_device(self, image: str) -> str:
        """The image's root device name (where root_volume_gb applies)."""
        if image not in self._root_devices:
            from botocore.exceptions import ClientError

            try:
                with mapped():
                    found = self.ec2.describe_images(ImageIds=[image])["Images"]
            except Fatal as e:
                if not isinstance(e.__cause__, ClientError):
                    raise
                found = []
            if not found:
                raise Fatal(f"AWS: image {image} does not exist in {self.region} (check the pool's image)")
            self._root_devices[image] = found[0]["RootDeviceName"]
        return self._root_devices[image]

    def terminate(self, instance_id: str) -> None:
        from botocore.exceptions import ClientError

        try:
            with mapped():
                self.ec2.terminate_instances(InstanceIds=[instance_id])
        except Fatal as e:
            cause = e.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in (
                    "InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
                return
            raise

    def poll(self, broker_id: str) -> list[Instance]:
        return self._describe([{"Name": f"tag:{TAG_BROKER}", "Values": [broker_id]}])

    def describe(self, instance_id: str) -> Instance | None:
        """The instance by id, None when it is gone or unknown."""
        from botocore.exceptions import ClientError

        try:
            with mapped():
                resp = self.ec2.describe_instances(InstanceIds=[instance_id])
        except Fatal as e:
            cause = e.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in (
                    "InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
                return None
            raise
        found = [_instance(i) for r in resp["Reservations"] for i in r["Instances"]]
        return next((i for i in found if i.state != InstanceState.GONE), None)

    def _by_node(self, node_id: str) -> Instance | None:
        found = self._describe([{"Name": f"tag:{TAG_NODE}", "Values": [node_id]}])
        return found[0] if found else None

    def _describe(self, filters: list[dict[str, Any]]) -> list[Instance]:
        out = []
        with mapped():
            for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
                for res in page["Reservations"]:
                    for inst in res["Instances"]:
                        i = _instance(inst)
                        if i.state != InstanceState.GONE:
                            out.append(i)
        return out

    def interruptions(self) -> list[Interruption]:
        """Receive the EventBridge->SQS queue's notices. A notice is NOT deleted here: the
        broker records it, then ack()s it (a broker that dies in between gets it again after
        the queue's visibility timeout). Messages that are not notices are deleted at once."""
        if self.sqs is None:
            return []
        out: dict[str, Interruption] = {}
        with mapped():
            for _ in range(MAX_RECEIVES):
                msgs = self.sqs.receive_message(QueueUrl=self.opts.queue_url, MaxNumberOfMessages=10,
                                                WaitTimeSeconds=0).get("Messages", [])
                if not msgs:
                    break
                for m in msgs:
                    it = parse_event(m["Body"])
                    if it is None:
                        self.sqs.delete_message(QueueUrl=self.opts.queue_url,
                                                ReceiptHandle=m["ReceiptHandle"])
                    else:
                        out[m["MessageId"]] = replace(it, key=m["MessageId"], receipt=m["ReceiptHandle"])
        return list(out.values())

    def ack(self, notices: list[Interruption]) -> None:
        """Delete recorded notices from the queue (one already gone is quiet)."""
        from botocore.exceptions import ClientError

        if self.sqs is None:
            return
        for n in notices:
            if n.receipt is None:
                continue
            try:
                with mapped():
                    self.sqs.delete_message(QueueUrl=self.opts.queue_url, ReceiptHandle=n.receipt)
            except Fatal as e:
                cause = e.__cause__
                if not (isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in (
                        "ReceiptHandleIsInvalid", "InvalidParameterValue")):
                    raise


def parse_event(body: str) -> Interruption | None:
    """An EventBridge event (JSON) -> Interruption, None for other events."""
    try:
        ev = json.loads(body)
    except ValueError:
        return None
    kind = EVENTS.get(ev.get("detail-type", ""))
    iid = ev.get("detail", {}).get("instance-id")
    if kind is None or not iid:
        return None
    deadline = None
    if ev.get("time"):
        deadline = datetime.fromisoformat(ev["time"].replace("Z", "+00:00")).timestamp()
        if kind == "spot_interruption":
            deadline += 120  # AWS gives two minutes' notice
    return Interruption(iid, kind, deadline)


def _instance(inst: dict[str, Any]) -> Instance:
    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
    return Instance(inst["InstanceId"], STATES.get(inst["State"]["Name"], InstanceState.PENDING),
                    tags, inst.get("Placement", {}).get("AvailabilityZone"),
                    "spot" if inst.get("InstanceLifecycle") == "spot" else "on_demand")

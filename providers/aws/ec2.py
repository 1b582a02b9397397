"""AWS EC2: on-demand and spot nodes, tagged, idempotent, reconciled (the Provider contract).

- offers(): GPU instance types from describe_instance_types (GpuInfo), priced by
  describe_spot_price_history (spot) or the catalog (on-demand; see pricing.catalog).
- launch(): run_instances with ClientToken = the broker's token, InstanceMarketOptions for
  spot (one-time, terminate on interruption), TagSpecifications and the bootstrap user data.
  Before calling, it looks for an instance already tagged with the node id (a launch whose
  answer was lost), so the token's 24-hour window is not the only guard.
- interruptions(): "EC2 Spot Instance Interruption Warning" and "EC2 Instance Rebalance
  Recommendation" events delivered by an EventBridge rule to an SQS queue (queue_url).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
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

CAPACITY_CODES = {"InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded",
                  "InstanceLimitExceeded", "VcpuLimitExceeded", "SpotMaxPriceTooLow",
                  "InsufficientCapacity", "Unsupported"}
TRANSIENT_CODES = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError",
                   "ServiceUnavailable", "Unavailable", "RequestTimeout"}
STATES = {"pending": InstanceState.PENDING, "running": InstanceState.RUNNING,
          "stopping": InstanceState.STOPPING, "stopped": InstanceState.STOPPING,
          "shutting-down": InstanceState.GONE, "terminated": InstanceState.GONE}
EVENTS = {"EC2 Spot Instance Interruption Warning": "spot_interruption",
          "EC2 Instance Rebalance Recommendation": "rebalance"}
DEFAULT_AMI = "ami-0onepool00000000"  # made up: set `image` in the pool for a real AMI
MAX_RECEIVES = 20  # receive calls per interruptions(): at most 200 notices, then the next round


def map_error(e: Exception) -> Exception:
    """botocore errors -> NoCapacity / Transient / Fatal, each saying what to do."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(e, ClientError):
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        msg = f"AWS {code}: {e.response.get('Error', {}).get('Message', '')}"
        if code in CAPACITY_CODES:
            return NoCapacity(f"{msg} (no capacity here now: another pool will be tried)")
        if code in TRANSIENT_CODES or status >= 500:
            return Transient(f"{msg} (temporary: retried with backoff)")
        return Fatal(f"{msg} (check the pool's instance_type, image, zone and the IAM policy "
                     "in infra/)")
    if isinstance(e, NoCredentialsError):
        return Fatal("no AWS credentials: set the pool's `credentials` to a profile name, or "
                     "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the broker's environment")
    if isinstance(e, EndpointConnectionError | ReadTimeoutError | ConnectionError):
        return Transient(f"AWS unreachable: {e} (retried with backoff)")
    return e


def _call(fn: Any, **kw: Any) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(**kw)
    except (ClientError, BotoCoreError) as e:
        raise map_error(e) from e


class AwsProvider:
    """One region's EC2 (and the interruption queue). `session` is a boto3 Session (a
    profile named by the pool's `credentials`); endpoint_url points at moto in tests/demo."""

    name = "aws"

    def __init__(self, region: str, *, session: Any = None, endpoint_url: str | None = None,
                 queue_url: str | None = None, image: str | None = None,
                 instance_types: list[str] | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 20.0) -> None:
        import boto3
        from botocore.config import Config

        sess = session or boto3.session.Session()
        # Timeouts bound a hung call; retries are ours (providers.retry, on Transient), not
        # botocore's as well, so a throttled call is not retried 4 x 5 times.
        cfg = Config(connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
                     retries={"mode": "standard", "max_attempts": 1})
        kw: dict[str, Any] = {"region_name": region, "config": cfg}
        if endpoint_url:
            kw["endpoint_url"] = endpoint_url
        self.region = region
        self.ec2 = sess.client("ec2", **kw)
        self.sqs = sess.client("sqs", **kw) if queue_url else None
        self.queue_url = queue_url
        self.image = image or DEFAULT_AMI
        self.instance_types = instance_types

    # -- offers ---------------------------------------------------------------------------
    @retrying
    def offers(self) -> list[Offer]:
        """GPU instance types (GpuInfo), with the latest spot price per type and zone."""
        kw: dict[str, Any] = {}
        if self.instance_types:
            kw["InstanceTypes"] = self.instance_types
        out: list[Offer] = []
        types: dict[str, tuple[str, int]] = {}
        for page in self.ec2.get_paginator("describe_instance_types").paginate(**kw):
            for it in page["InstanceTypes"]:
                gpus = it.get("GpuInfo", {}).get("Gpus", [])
                if gpus:
                    types[it["InstanceType"]] = (gpus[0]["Name"], sum(g["Count"] for g in gpus))
        for t, (gpu, n) in sorted(types.items()):
            out.append(Offer("aws", self.region, "", t, gpu, n, "on_demand", None))
        for (t, zone), price in sorted(self.spot_prices(sorted(types)).items()):
            if t in types:
                out.append(Offer("aws", self.region, zone, t, types[t][0], types[t][1], "spot", price))
        return out

    def spot_prices(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        """Newest spot price per (instance type, zone) from describe_spot_price_history."""
        if not instance_types:
            return {}
        resp = _call(self.ec2.describe_spot_price_history, InstanceTypes=instance_types,
                     ProductDescriptions=["Linux/UNIX"], MaxResults=1000)
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        for r in resp["SpotPriceHistory"]:
            key = (r["InstanceType"], r["AvailabilityZone"])
            if key not in newest or r["Timestamp"] > newest[key][0]:
                newest[key] = (r["Timestamp"], float(r["SpotPrice"]))
        return {k: v[1] for k, v in newest.items()}

    @retrying
    def zone_ids(self) -> dict[str, str]:
        """This account's AZ names -> AZ ids in the region (us-east-1a -> use1-az4): names map
        to ids differently per account, and prices are keyed by id (pricing.catalog)."""
        resp = _call(self.ec2.describe_availability_zones, AllAvailabilityZones=False)
        return {z["ZoneName"]: z["ZoneId"] for z in resp["AvailabilityZones"] if z.get("ZoneId")}

    # -- lifecycle ------------------------------------------------------------------------
    @retrying
    def launch(self, req: LaunchRequest) -> Instance:
        existing = self._by_node(req.node_id)
        if existing is not None:
            return existing
        kw: dict[str, Any] = {
            "ImageId": req.image or self.image, "InstanceType": req.instance_type,
            "MinCount": 1, "MaxCount": 1, "ClientToken": req.token, "UserData": req.user_data,
            "TagSpecifications": [{"ResourceType": r, "Tags": [{"Key": k, "Value": v}
                                                               for k, v in req.tags().items()]}
                                  for r in ("instance", "volume")],
        }
        if req.zone:
            kw["Placement"] = {"AvailabilityZone": req.zone}
        if req.market == "spot":
            kw["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        inst = _call(self.ec2.run_instances, **kw)["Instances"][0]
        return _instance(inst)

    @retrying
    def terminate(self, instance_id: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.ec2.terminate_instances(InstanceIds=[instance_id])
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("InvalidInstanceID.NotFound",
                                                           "InvalidInstanceID.Malformed"):
                return
            raise map_error(e) from e

    @retrying
    def poll(self, broker_id: str) -> list[Instance]:
        return self._describe([{"Name": f"tag:{TAG_BROKER}", "Values": [broker_id]}])

    @retrying
    def describe(self, instance_id: str) -> Instance | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp = self.ec2.describe_instances(InstanceIds=[instance_id])
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("InvalidInstanceID.NotFound",
                                                           "InvalidInstanceID.Malformed"):
                return None
            raise map_error(e) from e
        except BotoCoreError as e:
            raise map_error(e) from e
        found = [_instance(i) for r in resp["Reservations"] for i in r["Instances"]]
        return next((i for i in found if i.state != InstanceState.GONE), None)

    def _by_node(self, node_id: str) -> Instance | None:
        found = self._describe([{"Name": f"tag:{TAG_NODE}", "Values": [node_id]}])
        return found[0] if found else None

    def _describe(self, filters: list[dict[str, Any]]) -> list[Instance]:
        out = []
        resp = _call(self.ec2.describe_instances, Filters=filters)
        for res in resp["Reservations"]:
            for inst in res["Instances"]:
                i = _instance(inst)
                if i.state != InstanceState.GONE:
                    out.append(i)
        return out

    @retrying
    def interruptions(self) -> list[Interruption]:
        """Receive the EventBridge->SQS queue's notices. A notice is NOT deleted here: the
        broker records it, then ack()s it (a broker that dies in between gets it again after
        the queue's visibility timeout). Messages that are not notices are deleted at once."""
        if self.sqs is None:
            return []
        out: dict[str, Interruption] = {}
        for _ in range(MAX_RECEIVES):
            resp = _call(self.sqs.receive_message, QueueUrl=self.queue_url,
                         MaxNumberOfMessages=10, WaitTimeSeconds=0)
            msgs = resp.get("Messages", [])
            if not msgs:
                break
            for m in msgs:
                it = parse_event(m["Body"])
                if it is None:
                    _call(self.sqs.delete_message, QueueUrl=self.queue_url,
                          ReceiptHandle=m["ReceiptHandle"])
                else:
                    out[m["MessageId"]] = replace(it, key=m["MessageId"], receipt=m["ReceiptHandle"])
        return list(out.values())

    @retrying
    def ack(self, notices: list[Interruption]) -> None:
        """Delete recorded notices from the queue (one already gone is quiet)."""
        from botocore.exceptions import ClientError

        if self.sqs is None:
            return
        for n in notices:
            if n.receipt is None:
                continue
            try:
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=n.receipt)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("ReceiptHandleIsInvalid",
                                                                   "InvalidParameterValue"):
                    raise map_error(e) from e


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

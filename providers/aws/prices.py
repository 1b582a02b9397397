"""Spot prices as EC2 reports them: describe_spot_price_history from a start time, every
page, newest price per (instance type, AZ), each AZ with its name AND its id.

AZ names (us-east-1a) are shuffled per AWS account; AZ ids (use1-az1) name the same
physical zone in every account. describe_availability_zones gives the account's mapping, so
a price can be matched to a zone however the other side names it.

With a StartTime, EC2 returns the price in effect at that time and every change after it, so
a short look-back gives the current price of every (type, AZ) in few pages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from providers.aws.errors import mapped

PRODUCT = "Linux/UNIX"
LOOKBACK_S = 3600.0


@dataclass(frozen=True)
class SpotQuote:
    instance_type: str
    zone: str  # AZ name, as this account sees it (us-east-1a)
    zone_id: str | None  # AZ id, the same in every account (use1-az1)
    usd_per_hour: float
    at: datetime  # when this price took effect


def zone_ids(ec2: Any) -> dict[str, str]:
    """{AZ name: AZ id} of the client's region for this account."""
    with mapped():
        zones = ec2.describe_availability_zones()["AvailabilityZones"]
    return {z["ZoneName"]: z["ZoneId"] for z in zones if z.get("ZoneId")}


def spot_quotes(ec2: Any, instance_types: Iterable[str], now: float, zones: dict[str, str],
                lookback_s: float = LOOKBACK_S) -> list[SpotQuote]:
    """The newest Linux spot price per (instance type, AZ) since `now - lookback_s`, read
    through every page. `zones` is zone_ids(ec2); records that carry only an AZ id get the
    name from it. Sorted by type, then zone."""
    types = sorted(set(instance_types))
    if not types:
        return []
    names = {v: k for k, v in zones.items()}
    start = datetime.fromtimestamp(now - lookback_s, UTC)
    newest: dict[tuple[str, str], SpotQuote] = {}
    with mapped():
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=types, ProductDescriptions=[PRODUCT], StartTime=start,
            PaginationConfig={"PageSize": 1000})
        for page in pages:
            for r in page["SpotPriceHistory"]:
                zone = r.get("AvailabilityZone") or names.get(r.get("AvailabilityZoneId", ""), "")
                zid = r.get("AvailabilityZoneId") or zones.get(zone)
                q = SpotQuote(r["InstanceType"], zone, zid, float(r["SpotPrice"]), r["Timestamp"])
                key = (q.instance_type, q.zone)
                if key not in newest or q.at > newest[key].at:
                    newest[key] = q
    return [newest[k] for k in sorted(newest)]

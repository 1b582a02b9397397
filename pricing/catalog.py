"""The price catalog: typed offers from a dated CSV snapshot (pricing/data/, sources in
SOURCES.md), refreshed from the clouds' own APIs where they answer, normalized to $/GPU-hour,
with an interruption rate per spot offer.

Interruption rate. AWS's Spot Advisor gives, per region and instance type, a bucket of how
often spot instances were reclaimed over the trailing month (<5%, 5-10%, ..., >20%). A bucket
[lo, hi] becomes a per-hour rate by its midpoint p: rate = -ln(1 - p) / 730 (730 hours a
month, reclaims as a Poisson process). Offers with no such data (GCP, Azure, ...) get
`default_spot_rate_per_h`; on-demand offers get 0.

Refresh. `refresh_aws(ec2_client, region)` overwrites spot prices with the newest
describe_spot_price_history values, `refresh_aws_on_demand(pricing_client, ...)` on-demand
prices with the Price List API's; any error leaves the snapshot's price in place (and is
returned so the caller can log it).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
HOURS_PER_MONTH = 730.0
DEFAULT_SPOT_RATE_PER_H = -math.log(1 - 0.125) / HOURS_PER_MONTH  # the 10-15% bucket's midpoint


def is_aws_zone_name(zone: str, region: str) -> bool:
    """Whether `zone` is an AZ name of `region` (us-east-1a; local zones like
    us-east-1-bos-1a too), as opposed to an AZ id (use1-az1)."""
    return zone.startswith(region) and re.fullmatch(r"(-[a-z0-9]+)*[a-z]", zone[len(region):]) is not None


@dataclass(frozen=True)
class CatalogOffer:
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    gpus: int
    market: str  # on_demand | spot
    usd_per_hour: float  # per node
    interruption_rate_per_h: float
    source: str = "snapshot"  # snapshot | api

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus


def bucket_rate_per_h(pct_min: float, pct_max: float) -> float:
    """Monthly interruption bucket [pct_min, pct_max] % -> reclaims per hour."""
    p = min(0.999, (pct_min + pct_max) / 200.0)
    return -math.log(1.0 - p) / HOURS_PER_MONTH


class Catalog:
    """Offers indexed by (provider, region, instance_type, market)."""

    def __init__(self, offers: Iterable[CatalogOffer]) -> None:
        self.offers: list[CatalogOffer] = list(offers)

    @classmethod
    def snapshot(cls, data: Path = DATA, default_spot_rate_per_h: float = DEFAULT_SPOT_RATE_PER_H
                 ) -> Catalog:
        """The shipped snapshot. Raises FileNotFoundError naming the missing file."""
        rates: dict[tuple[str, str, str], float] = {}
        with open(data / "spot_interruption.csv", newline="") as f:
            for r in csv.DictReader(f):
                rates[(r["provider"], r["region"], r["instance_type"])] = bucket_rate_per_h(
                    float(r["interruption_pct_min"]), float(r["interruption_pct_max"]))
        out = []
        with open(data / "gpu_offers.csv", newline="") as f:
            for r in csv.DictReader(f):
                base = dict(provider=r["provider"], region=r["region"], zone=r["zone"],
                            instance_type=r["instance_type"], gpu_type=r["gpu_type"],
                            gpus=int(float(r["gpus_per_node"])))
                if r["on_demand_usd_per_hour"]:
                    out.append(CatalogOffer(**base, market="on_demand",
                                            usd_per_hour=float(r["on_demand_usd_per_hour"]),
                                            interruption_rate_per_h=0.0))
                if r["spot_usd_per_hour"]:
                    rate = rates.get((r["provider"], r["region"], r["instance_type"]),
                                     default_spot_rate_per_h)
                    out.append(CatalogOffer(**base, market="spot",
                                            usd_per_hour=float(r["spot_usd_per_hour"]),
                                            interruption_rate_per_h=rate))
        return cls(out)

    def find(self, provider: str, region: str, instance_type: str, market: str,
             zone: str | None = None, zone_ids: Mapping[str, str] | None = None) -> CatalogOffer | None:
        """The offer a pool of (provider, region, instance type, market) pays; None if the
        catalog has no such offer.

        zone: none given -> the cheapest zone. AWS keys its zones by AZ id (`use1-az1`), which
        is the same for every account, while pools name zones (`us-east-1a`), which AWS maps
        to ids differently per account. An AZ id is looked up as it is; an AZ name through
        `zone_ids` (name -> id, the account's describe_availability_zones), and without that
        mapping the dearest zone of the region is taken (never below what the account pays;
        `source` says so). Offers with no zone apply to every zone.
        """
        hits = [o for o in self.offers if (o.provider, o.region, o.instance_type, o.market)
                == (provider, region, instance_type, market)]
        if not zone or not hits:
            return min(hits, key=lambda o: o.usd_per_hour, default=None)
        zone_id = (zone_ids or {}).get(zone, zone)
        exact = [o for o in hits if o.zone in ("", zone_id)]
        if exact:
            return min(exact, key=lambda o: o.usd_per_hour)
        if zone_id == zone and is_aws_zone_name(zone, region) and zone not in (zone_ids or {}):
            dearest = max(hits, key=lambda o: o.usd_per_hour)
            return replace(dearest, zone=zone, source=f"{dearest.source}: dearest zone of {region} "
                           f"(the account's AZ id for {zone} is not known)")
        return None

    def cheapest(self, gpu_type: str, market: str | None = None) -> list[CatalogOffer]:
        """Offers of a GPU type, cheapest $/GPU-hour first."""
        return sorted((o for o in self.offers if o.gpu_type == gpu_type
                       and (market is None or o.market == market)),
                      key=lambda o: (o.usd_per_gpu_hour, o.provider, o.region, o.zone))

    def refresh_aws(self, ec2: Any, region: str, zone_ids: dict[str, str] | None = None
                    ) -> list[str]:
        """Overwrite AWS spot prices in `region` from describe_spot_price_history.
        `zone_ids` maps zone names (us-east-1a) to the snapshot's AZ ids (use1-az1); without
        it, every zone of the type gets the cheapest current price. Returns the errors."""
        from botocore.exceptions import BotoCoreError, ClientError

        types = sorted({o.instance_type for o in self.offers
                        if o.provider == "aws" and o.region == region and o.market == "spot"})
        try:
            resp = ec2.describe_spot_price_history(InstanceTypes=types,
                                                   ProductDescriptions=["Linux/UNIX"])
        except (ClientError, BotoCoreError) as e:
            return [f"aws spot prices in {region}: {e} (kept the snapshot's)"]
        newest: dict[tuple[str, str], tuple[Any, float]] = {}
        for r in resp["SpotPriceHistory"]:
            zone = (zone_ids or {}).get(r["AvailabilityZone"], "")
            key = (r["InstanceType"], zone)
            if key not in newest or r["Timestamp"] > newest[key][0]:
                newest[key] = (r["Timestamp"], float(r["SpotPrice"]))
        cheapest: dict[str, float] = {}
        for (t, _z), (_ts, p) in newest.items():
            cheapest[t] = min(p, cheapest.get(t, p))
        self.offers = [self._repriced(o, newest, cheapest) if o.provider == "aws" and o.region == region
                       and o.market == "spot" else o for o in self.offers]
        return []

    def reprice_spot(self, provider: str, region: str,
                     quotes: Iterable[tuple[str, str, float]]) -> int:
        """Set spot prices from (instance type, zone id, USD per node-hour) quotes, e.g. from
        providers.aws.prices.spot_quotes (paged, with AZ ids). A quote for a zone the snapshot
        lacks adds that zone's offer (from another zone of the type). Returns how many
        offers changed or were added."""
        changed = 0
        offers = list(self.offers)
        for itype, zone, usd in quotes:
            same = [i for i, o in enumerate(offers) if (o.provider, o.region, o.instance_type, o.market)
                    == (provider, region, itype, "spot")]
            at = [i for i in same if offers[i].zone == zone]
            if at:
                for i in at:
                    if offers[i].usd_per_hour != usd or offers[i].source != "api":
                        offers[i] = replace(offers[i], usd_per_hour=usd, source="api")
                        changed += 1
            elif same:
                offers.append(replace(offers[same[0]], zone=zone, usd_per_hour=usd, source="api"))
                changed += 1
        self.offers = offers
        return changed

    @staticmethod
    def _repriced(o: CatalogOffer, newest: dict[tuple[str, str], tuple[Any, float]],
                  cheapest: dict[str, float]) -> CatalogOffer:
        hit = newest.get((o.instance_type, o.zone))
        price = hit[1] if hit else cheapest.get(o.instance_type)
        return o if price is None else replace(o, usd_per_hour=price, source="api")

    def refresh_aws_on_demand(self, pricing: Any, region: str, instance_types: list[str]) -> list[str]:
        """Overwrite on-demand prices from the Price List API (pricing.get_products, Linux,
        shared tenancy, no pre-installed software). Returns the errors."""
        from botocore.exceptions import BotoCoreError, ClientError

        prices: dict[str, float] = {}
        errors = []
        for t in instance_types:
            filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
                ("instanceType", t), ("regionCode", region), ("operatingSystem", "Linux"),
                ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
            try:
                resp = pricing.get_products(ServiceCode="AmazonEC2", Filters=filters)
            except (ClientError, BotoCoreError) as e:
                errors.append(f"aws on-demand price of {t}: {e} (kept the snapshot's)")
                continue
            for item in resp.get("PriceList", []):
                p = parse_price_list_item(item)
                if p is not None:
                    prices[t] = p
        self.offers = [replace(o, usd_per_hour=prices[o.instance_type], source="api")
                       if o.provider == "aws" and o.region == region and o.market == "on_demand"
                       and o.instance_type in prices else o for o in self.offers]
        return errors


def parse_price_list_item(item: str | dict[str, Any]) -> float | None:
    """The hourly USD on-demand price in one Price List API product (JSON string or dict)."""
    d = json.loads(item) if isinstance(item, str) else item
    for term in d.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            if dim.get("unit") in ("Hrs", "Hours") and "USD" in dim.get("pricePerUnit", {}):
                return float(dim["pricePerUnit"]["USD"])
    return None

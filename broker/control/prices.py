"""Prices that move: the scheduled `refresh_prices` task (broker.control.scheduled).

Each run builds the catalog afresh and records every rented pool's price that changed:
- the catalog file (pricing/data, read again: GCP, libcloud and anything the APIs below do
  not answer are priced from it, so an updated file takes effect without a restart);
- AWS spot: describe_spot_price_history from a short look-back, every page, per AZ, matched
  to the catalog's AZ ids through the account's AZ name -> id mapping
  (providers.aws.prices.spot_quotes; Catalog.reprice_spot);
- AWS on-demand: the Price List API (`pricing` client, us-east-1 endpoint;
  Catalog.refresh_aws_on_demand).
Pools with a configured `price_per_node_hour` keep it. An API that fails leaves the file's
price in place; the error is logged and returned, and the next run tries again.

A changed price is recorded with `ledger.price_changed(pool, usd, now)` (through the capacity
manager, the one place that records prices), so the ledger charges the price in force at
each moment: before the refresh the old one, after it the new one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from broker.errors import Unpriced
from broker.spec import Market, PoolSpec
from pricing.catalog import Catalog
from providers.base import ProviderError

if TYPE_CHECKING:
    from broker.control.capacity_manager import CapacityManager

log = logging.getLogger("onepool.prices")
PRICE_LIST_REGION = "us-east-1"  # the Price List API's endpoint (it prices every region)


def refresh(cm: CapacityManager, now: float, pricing: Any | None = None) -> list[str]:
    """Re-price every rented pool (see the module docstring); returns the errors met.
    `pricing`: a Price List API client (default: one from the pool's boto3 session)."""
    cat = Catalog.snapshot()
    errors: list[str] = []
    aws: dict[str, list[PoolSpec]] = defaultdict(list)
    for spec in cm.pools.values():
        if spec.provider == "aws" and not spec.price_per_node_hour:
            aws[spec.region].append(spec)
    for region, specs in sorted(aws.items()):
        errors += _aws_region(cm, cat, region, specs, now, pricing)
    cm.use_catalog(cat)
    for spec in cm.pools.values():
        try:
            usd_gpu_h, _ = cm.price(spec)
        except Unpriced as e:
            errors.append(str(e))
            continue
        cm.record_price(spec, usd_gpu_h * spec.gpus_per_node, now)
    for e in errors:
        log.warning("price refresh: %s", e)
    return errors


def _aws_region(cm: CapacityManager, cat: Catalog, region: str, specs: list[PoolSpec], now: float,
                pricing: Any | None) -> list[str]:
    from providers.aws.prices import spot_quotes, zone_ids

    errors = []
    prov = cm.provider(specs[0].name)
    spot = sorted({s.instance_type or "" for s in specs if s.market is Market.SPOT})
    if spot:
        try:
            zones = zone_ids(prov.ec2)  # type: ignore[attr-defined]
            quotes = spot_quotes(prov.ec2, spot, now, zones)  # type: ignore[attr-defined]
            cat.reprice_spot("aws", region, [(q.instance_type, q.zone_id or q.zone, q.usd_per_hour)
                                             for q in quotes])
        except ProviderError as e:
            errors.append(f"aws spot prices in {region}: {e} (kept the catalog file's)")
    on_demand = sorted({s.instance_type or "" for s in specs if s.market is Market.ON_DEMAND})
    if on_demand:
        if pricing is None:
            from providers.aws.ec2 import client_config

            pricing = prov.session.client("pricing", region_name=PRICE_LIST_REGION,  # type: ignore[attr-defined]
                                          config=client_config())
        errors += cat.refresh_aws_on_demand(pricing, region, on_demand)
    return errors

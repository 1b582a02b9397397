"""The price catalog (snapshot, refresh through botocore's Stubber, $/GPU-hour) and the
effective-cost ranking."""

from __future__ import annotations

import datetime as dt
import json
import math

import boto3
import pytest
from botocore.stub import Stubber

from broker.policy import PendingView, PolicyConfig, PoolView
from broker.policy.cloud import offers
from broker.spec import Market, Priority
from pricing.catalog import Catalog, bucket_rate_per_h, parse_price_list_item


@pytest.mark.parametrize(("lo", "hi", "rate"), [
    (0, 5, -math.log(1 - 0.025) / 730), (5, 10, -math.log(1 - 0.075) / 730),
    (20, 100, -math.log(1 - 0.60) / 730)])
def test_interruption_buckets_become_a_per_hour_rate(lo: float, hi: float, rate: float) -> None:
    assert bucket_rate_per_h(lo, hi) == pytest.approx(rate)


def test_snapshot_offers_are_typed_and_normalized_per_gpu() -> None:
    cat = Catalog.snapshot()
    o = cat.find("aws", "us-east-1", "g5.12xlarge", "spot")
    assert o is not None and o.gpus == 4 and o.gpu_type == "A10G"
    assert o.usd_per_gpu_hour == pytest.approx(o.usd_per_hour / 4)
    assert o.interruption_rate_per_h == pytest.approx(bucket_rate_per_h(20, 100))  # ">20%" bucket
    od = cat.find("aws", "us-east-1", "g5.12xlarge", "on_demand")
    assert od is not None and od.interruption_rate_per_h == 0 and od.usd_per_hour > o.usd_per_hour
    gcp = next(x for x in cat.offers if x.provider == "gcp" and x.market == "spot")
    assert gcp.interruption_rate_per_h > 0  # the configurable default: no public GCP data
    assert cat.cheapest("H100")[0].usd_per_gpu_hour <= cat.cheapest("H100")[-1].usd_per_gpu_hour


def test_spot_prices_refresh_from_describe_spot_price_history() -> None:
    cat = Catalog.snapshot()
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    t = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    with Stubber(ec2) as st:
        st.add_response("describe_spot_price_history", {"SpotPriceHistory": [
            {"InstanceType": "g5.12xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "1.5000",
             "Timestamp": t, "ProductDescription": "Linux/UNIX"},
            {"InstanceType": "g5.12xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "9.0",
             "Timestamp": t - dt.timedelta(days=1), "ProductDescription": "Linux/UNIX"}]})
        assert cat.refresh_aws(ec2, "us-east-1", {"us-east-1a": "use1-az1"}) == []
    o = cat.find("aws", "us-east-1", "g5.12xlarge", "spot", zone="use1-az1")
    assert o is not None and o.usd_per_hour == 1.5 and o.source == "api"


def test_a_refresh_that_fails_keeps_the_snapshot_price() -> None:
    cat = Catalog.snapshot()
    before = cat.find("aws", "us-east-1", "g5.12xlarge", "spot")
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ec2) as st:
        st.add_client_error("describe_spot_price_history", "UnauthorizedOperation")
        errors = cat.refresh_aws(ec2, "us-east-1")
    assert errors and "kept the snapshot" in errors[0]
    assert cat.find("aws", "us-east-1", "g5.12xlarge", "spot") == before


def test_on_demand_prices_refresh_from_the_price_list_api() -> None:
    cat = Catalog.snapshot()
    product = {"product": {"attributes": {"instanceType": "g5.12xlarge"}}, "terms": {"OnDemand": {
        "X.Y": {"priceDimensions": {"X.Y.Z": {"unit": "Hrs", "pricePerUnit": {"USD": "5.6720000000"}}}}}}}
    assert parse_price_list_item(json.dumps(product)) == 5.672
    pricing = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x",
                           aws_secret_access_key="x")
    with Stubber(pricing) as st:
        st.add_response("get_products", {"PriceList": [json.dumps(
            {**product, "terms": {"OnDemand": {"a": {"priceDimensions": {"b": {
                "unit": "Hrs", "pricePerUnit": {"USD": "4.0"}}}}}}})], "FormatVersion": "aws_v1"})
        assert cat.refresh_aws_on_demand(pricing, "us-east-1", ["g5.12xlarge"]) == []
    o = cat.find("aws", "us-east-1", "g5.12xlarge", "on_demand")
    assert o is not None and o.usd_per_hour == 4.0


# Effective-cost ranking: (name, market, $/GPU-h, interruptions per hour)
TABLE = [("spot-flaky", Market.SPOT, 1.00, 0.5), ("spot-stable", Market.SPOT, 1.10, 0.01),
         ("on-demand", Market.ON_DEMAND, 3.00, 0.0)]


@pytest.mark.parametrize(("interval_s", "on_signal", "winner"), [
    (3600.0, False, "spot-stable"),  # long interval, no checkpoint on notice: rework dominates
    (60.0, True, "spot-flaky"),  # cheap rework: the cheapest list price wins
])
def test_effective_cost_ranking(interval_s: float, on_signal: bool, winner: str) -> None:
    pools = [PoolView(n, "A100", 8, (), m, p, max_nodes=4, interruption_rate_per_h=r)
             for n, m, p, r in TABLE]
    job = PendingView(1, "t", Priority.LOW, 8, 0.0, checkpoint_interval_s=interval_s)
    cfg = PolicyConfig(checkpoint_on_signal=on_signal, restart_overhead_s=60.0)
    ranked = [p.name for _, p in offers(job, pools, cfg, {})]
    assert ranked[0] == winner and ranked[-1] == "on-demand"


# g5.12xlarge spot in us-east-1 is priced by AZ id: az1 1.9937, az2 2.1378, az4 2.5445,
# az5 2.7041, az6 2.7324 (pricing/data/gpu_offers.csv).
@pytest.mark.parametrize(("zone", "zone_ids", "price", "note"), [
    (None, None, 1.9937, "no zone: the cheapest zone"),
    ("use1-az4", None, 2.5445, "an AZ id, as the catalog keys it"),
    ("us-east-1d", {"us-east-1d": "use1-az4"}, 2.5445, "a zone name, through the account's mapping"),
    ("us-east-1a", None, 2.7324, "a zone name without the mapping: the dearest zone, flagged"),
    ("use1-az3", None, None, "an AZ id without the offer: unknown, not free"),
    ("us-east-1e", {"us-east-1e": "use1-az3"}, None, "a mapped name without the offer: unknown"),
])
def test_a_pool_zone_finds_the_price_keyed_by_az_id(zone, zone_ids, price, note) -> None:
    hit = Catalog.snapshot().find("aws", "us-east-1", "g5.12xlarge", "spot", zone, zone_ids)
    assert (None if hit is None else hit.usd_per_hour) == price, note
    if zone == "us-east-1a":
        assert hit is not None and "dearest zone" in hit.source


def test_amortized_on_prem_gpu_hour() -> None:
    from pricing.cost import HOURS_PER_YEAR, amortized_usd_per_gpu_hour

    rate = amortized_usd_per_gpu_hour(240_000, 4, 8, power_usd_per_gpu_hour=0.09,
                                      hosting_usd_per_gpu_hour=0.06)
    assert rate == pytest.approx(240_000 / (4 * HOURS_PER_YEAR * 8) + 0.15)
    with pytest.raises(ValueError, match="years and gpus_per_node"):
        amortized_usd_per_gpu_hour(1, 0, 8)

"""The scheduled price refresh (broker.control.prices): AWS spot price history (paged, per AZ,
names mapped to ids) and the Price List API, through botocore's Stubber; every change is
recorded with its time and the ledger charges the price in force."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from sqlmodel import select

from broker.state import ledger
from broker.state.model import LedgerEntry, Node, Pool, PriceChange
from providers.aws import AwsProvider

pytestmark = pytest.mark.both_dbs

HOUR = 3600.0
KEYS = {"aws_access_key_id": "x", "aws_secret_access_key": "x", "region_name": "us-east-1"}


def aws_pool(name: str, market: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
            "max_nodes": 2, "market": market, "region": "us-east-1", "instance_type": "g5.12xlarge",
            "image": "ami-12345678", **kw}


ZONES = {"AvailabilityZones": [{"ZoneName": "us-east-1a", "ZoneId": "use1-az1"},
                               {"ZoneName": "us-east-1d", "ZoneId": "use1-az4"}]}


def history(page: list[tuple[str, str, float]], token: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"SpotPriceHistory": [
        {"InstanceType": "g5.12xlarge", "ProductDescription": "Linux/UNIX", "SpotPrice": str(usd),
         "AvailabilityZone": zone, "Timestamp": datetime.fromisoformat(at).replace(tzinfo=UTC)}
        for zone, at, usd in page]}
    if token:
        out["NextToken"] = token
    return out


def products(usd: float) -> dict[str, Any]:
    return {"FormatVersion": "aws_v1", "PriceList": [json.dumps({"terms": {"OnDemand": {"t": {
        "priceDimensions": {"d": {"unit": "Hrs", "pricePerUnit": {"USD": str(usd)}}}}}}})]}


def changes(c: Any, pool: str) -> list[tuple[float, float]]:
    with c.store.session() as s:
        return [(r.at, r.usd_per_node_hour) for r in s.exec(
            select(PriceChange).where(PriceChange.pool == pool).order_by(PriceChange.at))]


def test_price_refresh_records_changes_and_the_ledger_uses_them(make_cluster, clock):
    c, eng = make_cluster(pools=[aws_pool("spot", "spot", zone="us-east-1d"), aws_pool("od", "on_demand"),
                                 {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}],
                          server_url="http://127.0.0.1:9")
    prov = AwsProvider("us-east-1", session=boto3.Session(**KEYS))
    ec2 = boto3.client("ec2", **KEYS)
    prov.ec2 = ec2
    eng.capacity.providers.update({"spot": prov, "od": prov})
    pricing = boto3.client("pricing", **KEYS)
    t0 = clock.now()
    with Stubber(ec2) as st, Stubber(pricing) as pst:
        st.add_response("describe_availability_zones", ZONES)
        # two pages; us-east-1d is use1-az4 in this account: its price is 2.0, not az1's 1.0
        st.add_response("describe_spot_price_history", history(
            [("us-east-1a", "2026-12-03T09:00:00", 1.0)], token="p2"))
        st.add_response("describe_spot_price_history", history(
            [("us-east-1d", "2026-12-03T08:00:00", 9.0), ("us-east-1d", "2026-12-03T09:30:00", 2.0)]))
        st.add_response("describe_availability_zones", ZONES)  # the pool's own zone mapping
        pst.add_response("get_products", products(5.0))
        assert eng.capacity.refresh_prices(t0, pricing) == []
        st.assert_no_pending_responses()
        clock.advance(HOUR)
        st.add_response("describe_availability_zones", ZONES)
        st.add_response("describe_spot_price_history", history([("us-east-1d", "2026-12-03T10:20:00", 3.0)]))
        pst.add_response("get_products", products(5.0))
        assert eng.capacity.refresh_prices(clock.now(), pricing) == []
    assert changes(c, "spot") == [(t0, 2.0), (t0 + HOUR, 3.0)]
    assert changes(c, "od") == [(t0, 5.0)]  # unchanged: recorded once
    # a spot node on the meter across the change is charged each price for its time
    with c.store.session() as s:
        s.add(Node(id="spot-n1", pool="spot", gpus=4, state="up", token="t"))
        ledger.node_up(s, "spot-n1", "spot", 4, t0, rented=True)
        ledger.node_ready(s, "spot-n1", t0)
        s.commit()
        pool = s.get(Pool, "spot")
        assert pool is not None
        assert ledger.price_in_force(s, pool, t0 + 10) == 2.0
        assert ledger.price_in_force(s, pool, t0 + HOUR + 10) == 3.0
        ledger.accrue(s, t0 + 2 * HOUR)
        s.commit()
        usd = sum(e.usd for e in s.exec(select(LedgerEntry).where(LedgerEntry.node == "spot-n1")))
    assert usd == pytest.approx(2.0 + 3.0)


def test_a_failing_price_api_keeps_the_file_price_and_says_so(make_cluster, clock):
    c, eng = make_cluster(pools=[aws_pool("spot", "spot")], server_url="http://127.0.0.1:9")
    prov = AwsProvider("us-east-1", session=boto3.Session(**KEYS))
    prov.ec2 = boto3.client("ec2", **KEYS)
    eng.capacity.providers["spot"] = prov
    with Stubber(prov.ec2) as st:
        st.add_client_error("describe_availability_zones", "UnauthorizedOperation")
        errors = eng.capacity.refresh_prices(clock.now())
    assert errors and "kept the catalog file's" in errors[0]
    assert changes(c, "spot") == [(clock.now(), 1.9937 * 1)]  # the file's cheapest zone, per node

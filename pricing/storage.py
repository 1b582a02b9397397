"""What keeping checkpoint bytes in object storage costs: list prices as data, pure math.

The rates live in `pricing/data/storage.csv` (provider, USD per GiB-month, the page each
number comes from, and when it was recorded): each provider's standard storage class, first
volume tier, recorded offline (check them against the named pages before relying on them for
billing). A store is priced by its provider (`pricing.egress.provider_of`: s3:// is AWS, gs://
GCP, a local folder on-prem, which is free here because its disks are part of the nodes'
amortized price). A provider the table does not name gets the `default` row (an assumption).
A month is 730 hours, as AWS and GCP prorate storage.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pricing.egress import GIB, provider_of

DATA = Path(__file__).resolve().parent / "data" / "storage.csv"
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class StorageRate:
    provider: str
    usd_per_gib_month: float
    source: str
    as_of: str

    @property
    def usd_per_gib_hour(self) -> float:
        return self.usd_per_gib_month / HOURS_PER_MONTH


@cache
def load_rates(path: Path = DATA) -> dict[str, StorageRate]:
    """The rate table by provider. Raises ValueError naming a bad row."""
    out: dict[str, StorageRate] = {}
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            try:
                r = StorageRate(row["provider"], float(row["usd_per_gib_month"]), row["source"],
                                row["as_of"])
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{n}: bad storage row ({e}); expected "
                                 "provider,usd_per_gib_month,source,as_of") from None
            out[r.provider] = r
    return out


def rate_of(store_uri: str) -> StorageRate:
    """The storage rate of the store at `store_uri`."""
    rates = load_rates()
    return rates.get(provider_of(store_uri)) or rates["default"]


def storage_usd(nbytes: int, seconds: float, store_uri: str) -> float:
    """USD for keeping `nbytes` in the store at `store_uri` for `seconds`."""
    if nbytes <= 0 or seconds <= 0:
        return 0.0
    return nbytes / GIB * seconds / 3600.0 * rate_of(store_uri).usd_per_gib_hour

"""What moving checkpoint bytes between object stores costs: list prices as data, pure math.

The rates live in `pricing/data/egress.csv` (provider, scope, USD per GiB, the page each
number comes from, and the date it was recorded). They are the providers' published
first-tier list prices, recorded offline (this machine has no network): check them against
the named pages before relying on them for billing. Egress is charged by the *source* store's
provider, and it depends on where the bytes go:

- `same_region`: same provider, same region (a server-side copy inside one region): free
  on the big clouds;
- `inter_region`: same provider, another region;
- `internet`: another provider, or on-prem (leaving a cloud for anywhere else).

Rates are the first volume tier with no free allowance, per GiB (2**30 bytes, which is
what AWS and GCP bill as "GB"). A provider the table does not name is priced with the
`default` rows (stated assumptions, not a quote).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "egress.csv"
GIB = 1 << 30

# fsspec protocol -> the provider whose egress price applies to a store of that protocol.
PROVIDER_BY_SCHEME = {
    "s3": "aws", "s3a": "aws",
    "gs": "gcp", "gcs": "gcp",
    "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure",
    "file": "onprem", "local": "onprem", "memory": "onprem",
}


class Scope(StrEnum):
    SAME_REGION = "same_region"
    INTER_REGION = "inter_region"
    INTERNET = "internet"


@dataclass(frozen=True)
class Location:
    """Where a store is: its provider (aws, gcp, azure, onprem, ...) and region (None: unknown)."""

    provider: str
    region: str | None = None


@dataclass(frozen=True)
class EgressRate:
    provider: str
    scope: Scope
    usd_per_gib: float
    source: str
    as_of: str


def provider_of(uri: str) -> str:
    """The provider of a store URI by its scheme (no scheme: a local path, on-prem)."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else "file"
    return PROVIDER_BY_SCHEME.get(scheme, scheme)


@cache
def load_rates(path: Path = DATA) -> dict[tuple[str, Scope], EgressRate]:
    """The rate table, keyed by (provider, scope). Raises ValueError naming a bad row."""
    out: dict[tuple[str, Scope], EgressRate] = {}
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            try:
                r = EgressRate(row["provider"], Scope(row["scope"]), float(row["usd_per_gib"]),
                               row["source"], row["as_of"])
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{n}: bad egress row ({e}); expected "
                                 "provider,scope,usd_per_gib,source,as_of") from None
            out[(r.provider, r.scope)] = r
    return out


def scope_between(src: Location, dst: Location) -> Scope:
    """How far bytes travel. An unknown region on either side counts as another region."""
    if src.provider != dst.provider:
        return Scope.INTERNET
    if src.region is not None and src.region == dst.region:
        return Scope.SAME_REGION
    return Scope.INTER_REGION


def rate(src: Location, dst: Location) -> EgressRate:
    """The rate that applies to bytes copied from `src` to `dst`."""
    rates = load_rates()
    scope = scope_between(src, dst)
    return rates.get((src.provider, scope)) or rates[("default", scope)]


def egress_usd(nbytes: int, src: Location, dst: Location) -> float:
    """USD for copying `nbytes` from `src` to `dst` (0 for nothing copied)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / GIB * rate(src, dst).usd_per_gib

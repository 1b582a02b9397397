"""Build the Provider of a rented pool from its PoolSpec. No string dispatch elsewhere.

Pool fields used: region, zone, image, credentials (a reference, never a secret),
endpoint_url (a local emulator in tests and the demo), gpu_type and gpus_per_node (GCP
accelerators), and `options`, validated per provider by providers.options (AwsOptions,
GcpOptions, LibcloudOptions; the README lists every one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from providers.base import Fatal, NoticeLog, Provider
from providers.options import parse

if TYPE_CHECKING:
    from broker.spec import PoolSpec


def make_provider(pool: PoolSpec, notices: NoticeLog | None = None) -> Provider:
    """The pool's provider; `notices` is where it records notices read from the cloud's API
    (the broker's database). Raises Fatal saying what is missing when it cannot be built."""
    try:
        opts = parse(pool)
    except ValueError as e:
        raise Fatal(f"pool {pool.name}: {e}") from None
    if pool.provider == "aws":
        from providers.aws import AwsProvider
        from providers.aws.session import new_session

        session = new_session(pool.credentials) if pool.credentials else None
        return AwsProvider(pool.region, session=session, endpoint_url=pool.endpoint_url,
                           options=opts, image=pool.image)
    if pool.provider == "gcp":
        from providers.gcp import GcpProvider

        zones = opts.zones or [pool.zone or f"{pool.region}-a"]
        return GcpProvider.from_config(opts, zones, credentials_file=pool.credentials,
                                       endpoint_url=pool.endpoint_url, image=pool.image,
                                       gpu_type=pool.gpu_type, gpus=pool.gpus_per_node, notices=notices)
    if pool.provider == "libcloud":
        from providers.libcloud import LibcloudProvider

        return LibcloudProvider.from_config(opts, pool.credentials, pool=pool.name, image=pool.image,
                                            zone=pool.zone)
    raise Fatal(f"pool {pool.name}: provider {pool.provider!r} does not rent nodes")

"""Build the Provider of a rented pool from its PoolSpec. No string dispatch elsewhere.

Pool fields used: region, zone, image, credentials (a reference, never a secret),
endpoint_url (a local emulator in tests and the demo), options:
- aws: queue_url (the SQS queue an EventBridge rule feeds spot interruption warnings and
  rebalance recommendations into); connect_timeout_s, read_timeout_s (per API call; default
  5 and 20 seconds).
- gcp: project (required).
- libcloud: driver (a libcloud Provider name, e.g. AZURE_ARM, OPENSTACK; required),
  driver_args / driver_kwargs (non-secret), sizes ({size id: [gpu type, gpus]}).
  `credentials: env:KEY_VAR,SECRET_VAR` names the environment variables holding the
  driver's key and secret.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from providers.base import Fatal, Provider

if TYPE_CHECKING:
    from broker.spec import PoolSpec


def make_provider(pool: PoolSpec) -> Provider:
    """Raises Fatal saying what is missing when the pool cannot be served."""
    opts = pool.options
    if pool.provider == "aws":
        import boto3

        from providers.aws import AwsProvider

        session = boto3.session.Session(profile_name=pool.credentials) if pool.credentials else None
        timeouts = {k: float(opts[k]) for k in ("connect_timeout_s", "read_timeout_s") if k in opts}
        return AwsProvider(pool.region, session=session, endpoint_url=pool.endpoint_url,
                           queue_url=opts.get("queue_url"), image=pool.image, **timeouts)
    if pool.provider == "gcp":
        from providers.gcp import GcpProvider

        if "project" not in opts:
            raise Fatal(f"pool {pool.name}: a gcp pool needs options.project")
        return GcpProvider.from_config(project=opts["project"], zone=pool.zone or f"{pool.region}-a",
                                       credentials_file=pool.credentials,
                                       endpoint_url=pool.endpoint_url, image=pool.image)
    if pool.provider == "libcloud":
        from providers.libcloud import LibcloudProvider

        if "driver" not in opts:
            raise Fatal(f"pool {pool.name}: a libcloud pool needs options.driver (e.g. AZURE_ARM)")
        return LibcloudProvider.from_config(opts["driver"], credentials=pool.credentials,
                                            args=opts.get("driver_args", []),
                                            kwargs=opts.get("driver_kwargs", {}),
                                            sizes=opts.get("sizes", {}), image=pool.image,
                                            zone=pool.zone)
    raise Fatal(f"pool {pool.name}: provider {pool.provider!r} does not rent nodes")

"""botocore errors -> NoCapacity / Transient / Fatal, each saying what the caller should do.

botocore's own retry layer (adaptive mode, providers.aws.ec2.client_config) has already
retried throttling, 5xx and connection errors when one reaches here: a Transient is raised
only once those retries ran out, and the broker tries again on a later cycle.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from providers.base import Fatal, NoCapacity, Transient

CAPACITY_CODES = {"InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded",
                  "InstanceLimitExceeded", "VcpuLimitExceeded", "SpotMaxPriceTooLow",
                  "InsufficientCapacity", "Unsupported", "InsufficientFreeAddressesInSubnet"}
TRANSIENT_CODES = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError",
                   "ServiceUnavailable", "Unavailable", "RequestTimeout"}


def map_error(e: Exception) -> Exception:
    """A botocore exception as the error the caller acts on (other exceptions unchanged)."""
    from botocore.exceptions import (
        BotoCoreError,
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
            return Transient(f"{msg} (temporary: botocore's retries ran out; the next cycle tries again)")
        return Fatal(f"{msg} (check the pool's instance_type, image, options and the IAM policy "
                     "in infra/)")
    if isinstance(e, NoCredentialsError):
        return Fatal("no AWS credentials: set the pool's `credentials` to a profile name, or "
                     "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the broker's environment")
    if isinstance(e, EndpointConnectionError | ReadTimeoutError | ConnectionError):
        return Transient(f"AWS unreachable: {e} (botocore's retries ran out; the next cycle tries again)")
    if isinstance(e, BotoCoreError):  # a request botocore refused to send (bad parameters, ...)
        return Fatal(f"AWS: {e} (check the pool's settings)")
    return e


@contextmanager
def mapped() -> Iterator[None]:
    """Run a block of boto3 calls; their errors leave it mapped."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise map_error(e) from e

"""One retry layer per SDK. ONEPOOL_PROVIDER_RETRIES is the number of attempts of one call.

- boto3: botocore's own retries in adaptive mode (providers.aws.client_config uses ATTEMPTS);
  nothing retries around it.
- google-cloud-compute (its clients' default retries on reads are turned off: every call
  passes retry=None) and libcloud (it has none): `retrying`, tenacity's exponential backoff
  with jitter on Transient.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from providers.base import Transient

T = TypeVar("T")
ATTEMPTS = int(os.environ.get("ONEPOOL_PROVIDER_RETRIES", "4"))
MAX_WAIT_S = float(os.environ.get("ONEPOOL_PROVIDER_RETRY_MAX_S", "8"))


def retrying(fn: Callable[..., T]) -> Callable[..., T]:
    """Retry `fn` on Transient up to ATTEMPTS times, then re-raise the last Transient."""
    return retry(retry=retry_if_exception_type(Transient), reraise=True,
                 stop=stop_after_attempt(ATTEMPTS),
                 wait=wait_random_exponential(multiplier=0.05, max=MAX_WAIT_S))(fn)

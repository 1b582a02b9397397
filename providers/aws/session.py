"""boto3 sessions that share one botocore data loader per process.

A botocore session reads the JSON service models (EC2's is several megabytes) and the endpoint
data through its loader, which caches them per loader instance; every fresh session re-reads
and re-parses them (a quarter of a second of CPU per client). The broker builds a provider per
rented pool, and again on every config change, so the loader (read-only once loaded) is
shared. Credentials, region and profile stay per session.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _shared_loader() -> Any:
    """The process's loader (threads racing on the first call may each build one; the cache
    keeps one, and every later call gets it)."""
    from botocore.loaders import create_loader

    return create_loader()


def new_session(profile_name: str | None = None) -> Any:
    """A new boto3 Session (the named profile's credentials, or the default chain) whose
    service models come from the process's shared loader. Raises botocore's
    ProfileNotFound for an unknown profile, as boto3.session.Session does."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    if core.get_config_variable("data_path") is None:  # AWS_DATA_PATH: the session's own models
        core.register_component("data_loader", _shared_loader())
    return boto3.session.Session(botocore_session=core, profile_name=profile_name)

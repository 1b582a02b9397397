"""What onepool needs to know about each libcloud compute driver, as data.

libcloud has no common way to pass user data, tags or a spot request: every driver names
its own `create_node` argument. A profile says which argument carries the boot script (so
the node's agent starts), which keeps the broker's ids as tags (and where `list_nodes`
returns them), and which asks for spot capacity. Drivers not listed here get the user-data
argument found in their `create_node` signature (`ex_userdata`, `ex_user_data`,
`ex_customdata`), no tags and no spot.

This module imports nothing of libcloud, so onepool.yaml can be checked without it
(providers.options); `apply_workarounds` runs on a live driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

USER_DATA_ARGS = ("ex_userdata", "ex_user_data", "ex_customdata")


@dataclass(frozen=True)
class DriverProfile:
    """How onepool calls one driver's create_node."""

    user_data: str | None  # the create_node argument that carries the boot script
    tags: str | None = None  # the argument taking a {key: value} mapping kept on the node
    tags_extra: str = "tags"  # where list_nodes returns it (node.extra[...])
    spot: Mapping[str, Any] = field(default_factory=dict)  # arguments asking for spot capacity
    user_data_bytes: bool = False  # the driver base64-encodes the script itself and needs bytes
    # list_images arguments that list an image's siblings (None: look it up with get_image)
    image_scope: Callable[[str], dict[str, Any]] | None = None


def azure_image_scope(urn: str) -> dict[str, Any]:
    """Azure marketplace images are PUBLISHER:OFFER:SKU:VERSION (VERSION may be `latest`);
    its siblings are the versions of that sku. get_image cannot tell whether one exists (it
    builds the image object without asking), list_images of the sku can."""
    parts = urn.split(":")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"an Azure image is PUBLISHER:OFFER:SKU:VERSION, e.g. "
                         f"Canonical:ubuntu-24_04-lts:server:latest (got {urn!r})")
    return {"ex_publisher": parts[0], "ex_offer": parts[1], "ex_sku": parts[2]}


PROFILES: dict[str, DriverProfile] = {
    # Azure ARM: custom data (cloud-init runs it as user data on Ubuntu images), tags. No spot
    # option in libcloud 3.9.1 (its create_node has no priority/eviction arguments).
    "azure_arm": DriverProfile("ex_customdata", tags="ex_tags", user_data_bytes=True,
                               image_scope=azure_image_scope),
    "ec2": DriverProfile("ex_userdata", tags="ex_metadata", spot={"ex_spot": True}),
    "openstack": DriverProfile("ex_userdata", tags="ex_metadata", tags_extra="metadata"),
    "vultr": DriverProfile("ex_userdata"),
    "linode": DriverProfile("ex_userdata"),
}


def profile_for(driver_type: str, create_node_args: list[str] | None = None) -> DriverProfile | None:
    """The profile of a driver (its libcloud Provider value, e.g. "azure_arm"). For an unlisted
    driver, one built from its create_node argument names when given; None if the driver
    takes no user data at all (onepool cannot boot an agent there)."""
    if driver_type.lower() in PROFILES:
        return PROFILES[driver_type.lower()]
    if create_node_args is None:
        return None
    arg = next((a for a in USER_DATA_ARGS if a in create_node_args), None)
    return DriverProfile(arg) if arg else None


def spot_drivers() -> list[str]:
    return sorted(k for k, p in PROFILES.items() if p.spot)


def apply_workarounds(driver_type: str, driver: Any) -> None:
    """Fix known driver bugs on a live driver object.

    azure_arm, libcloud <= 3.9.1 (apache/libcloud#1893, fixed upstream after 3.9.1):
    create_node base64-encodes ex_customdata with b64encode, which needs bytes, and puts the
    resulting bytes into the JSON body, which json.dumps refuses. onepool passes bytes and
    the connection encodes bytes in the body as text.
    """
    if driver_type.lower() != "azure_arm":
        return
    conn = driver.connection

    def encode_data(data: Any) -> str:
        return json.dumps(data, default=_bytes_as_text)

    conn.encode_data = encode_data


def _bytes_as_text(o: Any) -> str:
    if isinstance(o, bytes):
        return o.decode("ascii")
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

"""The `options:` of rented pools in onepool.yaml, one typed model per provider.

broker.spec validates every pool through `check_pool` (so `onepool apply` refuses a bad
option with the field and the allowed values, before anything is written), and
providers.registry builds each provider from `parse`. Nothing here talks to a cloud.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from providers.gcp.accelerators import ACCELERATOR_TYPES, accelerator_type, carries_gpus
from providers.libcloud.profiles import PROFILES, profile_for, spot_drivers
from providers.names import is_instance_name, label_value

if TYPE_CHECKING:
    from broker.spec import PoolSpec

SubnetId = Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]
GroupId = Annotated[str, Field(pattern=r"^sg-[0-9a-f]{8,17}$")]
Zone = Annotated[str, Field(pattern=r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")]
Scope = Annotated[str, Field(pattern=r"^https://www\.googleapis\.com/auth/[a-z0-9_.-]+$")]
NetworkTag = Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")]
AWS_IMAGE = re.compile(r"^(ami-[0-9a-z]{8,17}|resolve:ssm:/?[A-Za-z0-9_./-]+)$")
GCP_IMAGE = re.compile(r"^(https://www\.googleapis\.com/compute/v1/)?projects/[a-z0-9.:-]+/global/images/"
                       r"(family/)?[a-z]([-a-z0-9]*[a-z0-9])?$")
# Least privilege by default: the VM's service account may read and write Cloud Storage
# (checkpoints) and write logs; its IAM roles decide the rest.
GCP_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",
              "https://www.googleapis.com/auth/logging.write")

HELP = {
    "subnet_ids": "subnet ids like subnet-0123456789abcdef0",
    "security_group_ids": "security group ids like sg-0123456789abcdef0",
    "instance_profile": "an instance profile name or ARN (arn:aws:iam::123456789012:instance-profile/NAME)",
    "zones": "zones like us-central1-a",
    "scopes": "OAuth scope URLs like https://www.googleapis.com/auth/devstorage.read_write",
    "service_account": "a service account e-mail, or 'default'",
    "project": "a GCP project id",
    "accelerator_type": "a GCP accelerator type like nvidia-tesla-t4",
    "driver": "a libcloud Provider name like AZURE_ARM, EC2, OPENSTACK",
    "network_tags": "network tags (lowercase letters, digits, '-')",
}


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AwsOptions(_Options):
    """`provider: aws` pool options."""

    queue_url: str | None = Field(default=None, pattern=r"^https?://\S+$")  # EventBridge -> SQS notices
    instance_profile: str | None = Field(
        default=None,
        pattern=r"^(arn:aws[a-z-]*:iam::\d{12}:instance-profile/[\w+=,.@/-]+|[\w+=,.@-]{1,128})$")
    subnet_ids: list[SubnetId] = Field(default_factory=list)  # tried in order on capacity errors
    security_group_ids: list[GroupId] = Field(default_factory=list)
    root_volume_gb: int | None = Field(default=None, ge=8, le=16384)  # None: the image's size
    connect_timeout_s: float = Field(default=5.0, gt=0, le=300)  # per API call
    read_timeout_s: float = Field(default=20.0, gt=0, le=900)

    @model_validator(mode="after")
    def _unique(self) -> AwsOptions:
        _no_repeats("subnet_ids", self.subnet_ids)
        _no_repeats("security_group_ids", self.security_group_ids)
        return self


class GcpOptions(_Options):
    """`provider: gcp` pool options."""

    project: str = Field(pattern=r"^[a-z][a-z0-9.:-]{0,62}$")
    zones: list[Zone] = Field(default_factory=list)  # tried in order on capacity errors
    service_account: str = Field(default="default",
                                 pattern=r"^(default|[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,})$")
    scopes: list[Scope] = Field(default_factory=lambda: list(GCP_SCOPES), min_length=1)
    accelerator_type: str | None = Field(default=None, pattern=r"^nvidia-[a-z0-9-]+$")
    root_volume_gb: int = Field(default=200, ge=10, le=65536)
    network: str = Field(default="global/networks/default", min_length=1)
    subnetwork: str | None = Field(default=None,
                                   pattern=r"^(projects/[^/]+/)?regions/[a-z0-9-]+/subnetworks/\S+$")
    external_ip: bool = False  # True: an ephemeral public IP (no Cloud NAT on the subnet)
    network_tags: list[NetworkTag] = Field(default_factory=lambda: ["onepool-node"])  # firewall targets

    @model_validator(mode="after")
    def _unique(self) -> GcpOptions:
        _no_repeats("zones", self.zones)
        return self


class LibcloudAuth(_Options):
    """How to log in to the node, where the driver requires it (Azure ARM does): exactly one."""

    ssh_key: str | None = Field(default=None, pattern=r"^(ssh-|ecdsa-)\S+ \S+")
    ssh_key_file: str | None = None
    password_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="after")
    def _one(self) -> LibcloudAuth:
        given = [k for k in ("ssh_key", "ssh_key_file", "password_env") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("set exactly one of ssh_key, ssh_key_file, password_env "
                             f"(got {given or 'none'})")
        return self


class LibcloudOptions(_Options):
    """`provider: libcloud` pool options. Every value is non-secret: secrets come from the
    environment variables the pool's `credentials` names."""

    driver: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    driver_args: list[Any] = Field(default_factory=list)  # the driver's constructor
    driver_kwargs: dict[str, Any] = Field(default_factory=dict)
    sizes: dict[str, tuple[str, int]] = Field(default_factory=dict)  # size id: [gpu type, gpus]
    create_node: dict[str, Any] = Field(default_factory=dict)  # extra create_node arguments
    list_nodes: dict[str, Any] = Field(default_factory=dict)
    destroy_node: dict[str, Any] = Field(default_factory=dict)
    list_images: dict[str, Any] = Field(default_factory=dict)  # to name the images that exist
    auth: LibcloudAuth | None = None
    tags: dict[str, str] = Field(default_factory=dict)  # extra tags, where the driver keeps tags


MODELS: dict[str, type[_Options]] = {"aws": AwsOptions, "gcp": GcpOptions, "libcloud": LibcloudOptions}
RESERVED = ("name", "size", "image", "location", "auth")  # create_node arguments onepool sets


def parse(pool: PoolSpec) -> Any:
    """The pool's options as its provider's model (AwsOptions, GcpOptions, LibcloudOptions).
    Raises ValueError naming each bad option and what is allowed."""
    model = MODELS[pool.provider]
    try:
        return model.model_validate(pool.options)
    except ValidationError as e:
        raise ValueError("; ".join(_describe(e))) from None


def check_pool(pool: PoolSpec) -> None:
    """Every rule about a rented pool's options, image and name that needs no cloud call.
    Raises ValueError with one line per problem."""
    opts = parse(pool)
    problems = {"aws": _aws, "gcp": _gcp, "libcloud": _libcloud}[pool.provider](pool, opts)
    if problems:
        raise ValueError("; ".join(problems))


def check_pools(pools: Iterable[PoolSpec]) -> list[str]:
    """Rules across pools: GCP labels must tell the pools apart."""
    seen: dict[str, str] = {}
    out = []
    for p in pools:
        if p.provider != "gcp":
            continue
        label = label_value(p.name)
        if label in seen:
            out.append(f"pools: GCP label values cannot tell pools {seen[label]!r} and {p.name!r} apart "
                       f"(both become {label!r}); rename one")
        seen[label] = p.name
    return out


def _aws(pool: PoolSpec, opts: AwsOptions) -> list[str]:
    out = []
    if pool.image and not AWS_IMAGE.match(pool.image):
        out.append(f"image: must be an AMI id (ami-0123456789abcdef0) or an SSM parameter "
                   f"(resolve:ssm:/aws/service/...) (got {pool.image!r})")
    if pool.zone and opts.subnet_ids:
        out.append("zone: a pool with options.subnet_ids launches in its subnets' zones; drop zone")
    return out


def _gcp(pool: PoolSpec, opts: GcpOptions) -> list[str]:
    out = []
    if pool.image and not GCP_IMAGE.match(pool.image):
        out.append("image: must be projects/PROJECT/global/images/family/FAMILY or "
                   f"projects/PROJECT/global/images/IMAGE (got {pool.image!r})")
    if pool.zone and opts.zones:
        out.append("zone: set options.zones (several, tried in order) or zone, not both")
    for z in opts.zones or ([pool.zone] if pool.zone else []):
        if not z.startswith(f"{pool.region}-"):
            out.append(f"options.zones: zone {z!r} is not in the pool's region {pool.region!r}")
    if (not carries_gpus(pool.instance_type or "")
            and accelerator_type(pool.gpu_type, opts.accelerator_type) is None):
        out.append(f"options.accelerator_type: {pool.instance_type} carries no GPUs and gpu_type "
                   f"{pool.gpu_type!r} has no known accelerator type; set one (known: "
                   f"{', '.join(f'{k}={v}' for k, v in ACCELERATOR_TYPES.items())})")
    return out


def _libcloud(pool: PoolSpec, opts: LibcloudOptions) -> list[str]:
    out = []
    kind = opts.driver.lower()
    profile = profile_for(kind)
    if pool.market.value == "spot" and kind in PROFILES and not PROFILES[kind].spot:
        out.append(f"market: libcloud's {kind} driver has no spot option; use market: on_demand "
                   f"(drivers with spot: {', '.join(spot_drivers())})")
    if profile is not None and profile.tags is None and not is_instance_name(f"{pool.name}-0a1b2c3d"):
        out.append(f"name: libcloud's {kind} driver keeps no tags, so onepool finds its nodes by "
                   "name; use a pool name of lowercase letters, digits and '-' that starts with "
                   f"a letter (got {pool.name!r})")
    bad = sorted(set(opts.create_node) & set(RESERVED))
    if bad:
        out.append(f"options.create_node: {', '.join(bad)} are set by onepool (image, instance_type, "
                   "zone, options.auth)")
    return out


def _no_repeats(name: str, items: list[str]) -> None:
    dup = sorted({x for x in items if items.count(x) > 1})
    if dup:
        raise ValueError(f"{name}: listed twice: {', '.join(dup)}")


def _describe(e: ValidationError) -> list[str]:
    out = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        top = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch" and top in HELP:
            msg = f"must be {HELP[top]}"
        elif err["type"] == "extra_forbidden":
            msg = "unknown option (check the spelling)"
        quiet = err["type"] in ("missing", "extra_forbidden") or "(got" in msg
        got = "" if quiet else f" (got {err['input']!r})"
        out.append(f"options{'.' + loc if loc else ''}: {msg}{got}")
    return out


"""The pool section of `onepool.yaml`: one pool's nodes, provider, market and cost (PoolSpec),
a Slurm pool's partition settings (SlurmSpec) and an on-prem node's amortized cost
(OnpremCost). Re-exported by broker.spec, the one config source the rest of the code imports."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from broker.spec_broker import store_uri
from broker.spec_types import (
    NODE_RUNTIMES,
    SLURM_RUNTIMES,
    ContainerRuntime,
    Market,
    Name,
    _Strict,
    image_ref,
)


class OnpremCost(_Strict):
    """What an on-prem node costs, from what its owner knows: the purchase price spread over its
    years of service (every hour, idle ones too), plus power and hosting per GPU-hour. The
    ledger charges `pricing.cost.amortized_usd_per_gpu_hour(...)` of these."""

    purchase_usd_per_node: float = Field(ge=0.0)
    years: float = Field(gt=0.0, le=30.0)
    power_usd_per_gpu_hour: float = Field(default=0.0, ge=0.0)
    hosting_usd_per_gpu_hour: float = Field(default=0.0, ge=0.0)


# The forms of a slurm pool's settings: (regex, what the error says is allowed).
_SLURM_FORMS = {
    "name": (r"^[A-Za-z0-9_.+-]{1,64}$", "a Slurm name: letters, digits, '_', '.', '+', '-' (1-64 chars)"),
    "login": (r"^([A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9._-]*$", "host or user@host"),
    "mem": (r"^\d+[KMGT]?$", "a size like 64G or 65536 (MB)"),
    "time": (r"^(\d+-)?\d+(:\d+){0,2}$|^(UNLIMITED|INFINITE)$",
             "a Slurm time like 60, 4:00:00 or 2-00:00:00"),
    "ssh": (r"^[A-Za-z]+=\S.*$", "an ssh -o setting like Port=2222"),
}


def _slurm_form(kind: str, v: str) -> str:
    regex, allowed = _SLURM_FORMS[kind]
    if not re.match(regex, v):
        raise ValueError(f"must be {allowed} (got {v!r})")
    return v


class SlurmSpec(_Strict):
    """Where a `provider: slurm` pool submits (issue 14): a partition of an existing cluster,
    reached with the Slurm commands on the broker's machine, or over SSH on `login`."""

    partition: str
    account: str | None = None
    qos: str | None = None
    # The GRES type of the pool's GPUs (`gpu:<type>:N`), matched case-insensitively; None:
    # untyped (`--gres=gpu:N`), every GPU of a node counts.
    gres_type: str | None = None
    # "host" or "user@host" of a login node; None: the commands run on the broker's machine.
    login: str | None = None
    ssh_options: list[str] = Field(default_factory=list)  # ssh -o settings, e.g. Port=2222
    command_timeout_s: float = Field(default=30.0, gt=0.0, le=600.0)
    # Where each attempt's output goes, on the cluster's filesystem. None: the broker home's
    # runs/ folder when local (where `onepool logs` reads), `onepool-runs` in the login home over SSH.
    output_dir: str | None = Field(default=None, min_length=1)
    # The jobcomp/filetxt log (JobCompLoc), read for jobs that left slurmctld's memory when
    # accounting (sacct) is off.
    jobcomp_log: str | None = Field(default=None, min_length=1)
    # An attempt Slurm has not started this long after submission (someone else got the
    # GPUs first) is cancelled and goes back to onepool's queue.
    start_timeout_s: float = Field(default=120.0, gt=0.0, le=86400.0)
    cpus_per_gpu: int | None = Field(default=None, ge=1, le=1024)
    mem_per_gpu: str | None = None
    time_limit: str | None = None

    @field_validator("partition", "account", "qos", "gres_type", "login", "mem_per_gpu", "time_limit")
    @classmethod
    def _forms(cls, v: str | None, info: ValidationInfo) -> str | None:
        kinds = {"login": "login", "mem_per_gpu": "mem", "time_limit": "time"}
        return None if v is None else _slurm_form(kinds.get(info.field_name or "", "name"), v)

    @field_validator("ssh_options")
    @classmethod
    def _ssh_options(cls, v: list[str]) -> list[str]:
        for opt in v:
            _slurm_form("ssh", opt)
        return v


class PoolSpec(_Strict):
    """One pool: identical nodes of one GPU type behind one provider."""

    name: Name
    provider: str = "local"
    gpu_type: str = Field(min_length=1, max_length=40)
    gpus_per_node: int = Field(ge=1, le=64)
    nodes: int = Field(ge=0, le=100_000)
    region: str = "local"
    market: Market = Market.ONPREM
    price_per_node_hour: float = Field(default=0.0, ge=0.0)
    store: str | None = None  # checkpoint store URI for this pool; default: the broker's store
    # A file:// store (the pool's or the broker's) on a filesystem every node of the pool mounts
    # (NFS, a Slurm cluster's shared disk): without it, `onepool apply` refuses such a store for
    # a pool whose nodes are not the server (see unreachable_stores).
    store_shared: bool = False
    # -- rented (cloud) pools: provider aws | gcp | libcloud (issue 4; see providers.registry) --
    max_nodes: int | None = Field(default=None, ge=1, le=10_000)  # rented pools grow up to this
    instance_type: str | None = None  # e.g. p4d.24xlarge, a2-highgpu-1g, a libcloud size id
    zone: str | None = None
    image: str | None = None  # AMI / image; default: the provider's
    launch_latency_s: float = Field(default=120.0, ge=0.0)
    idle_timeout_s: float = Field(default=600.0, ge=0.0)  # give an idle rented node back after
    interruption_rate_per_h: float | None = Field(default=None, ge=0.0)  # default: the catalog's
    # A rented node whose agent has not joined this long after the launch request is given back.
    boot_timeout_s: float = Field(default=900.0, gt=0.0, le=86400.0)
    # A REFERENCE to credentials, never a secret: an AWS profile name, a GCP service-account
    # file path, or for libcloud "env:VAR1,VAR2" naming environment variables holding them.
    credentials: str | None = None
    endpoint_url: str | None = None  # a non-default API endpoint (a local emulator, a private cloud)
    options: dict[str, Any] = Field(default_factory=dict)  # provider-specific, see providers.options
    # provider slurm: the partition it submits to. Its nodes and free GPUs are read from Slurm
    # every cycle; `nodes` x `gpus_per_node` is the shape submissions are checked against.
    slurm: SlurmSpec | None = None
    # What runs a job's `image` here (issue 26): podman or docker on local, agent and rented
    # nodes (default: whichever the node has); a Slurm pool runs image jobs only when it names
    # its container plug-in (pyxis, apptainer).
    container_runtime: ContainerRuntime | None = None
    # Images a rented node pulls while it boots, before its agent joins (issue 26): a job in one
    # of them starts without waiting for the pull (providers.bootstrap).
    prepull_images: list[str] = Field(default_factory=list, max_length=16)

    @field_validator("prepull_images")
    @classmethod
    def _prepull(cls, v: list[str]) -> list[str]:
        for i, ref in enumerate(v):
            try:
                image_ref(ref)
            except ValueError as e:
                raise ValueError(f"prepull_images[{i}]: {e}") from None
        return v

    @model_validator(mode="after")
    def _runtime_fits(self) -> PoolSpec:
        if self.container_runtime is None:
            return self
        allowed = SLURM_RUNTIMES if self.provider == "slurm" else NODE_RUNTIMES
        if self.container_runtime not in allowed:
            raise ValueError(f"container_runtime: a {self.provider} pool takes "
                             f"{' or '.join(r.value for r in allowed)} (got {self.container_runtime.value})")
        return self

    @model_validator(mode="after")
    def _rented(self) -> PoolSpec:
        if self.prepull_images and self.provider in ("local", "agent", "slurm"):
            raise ValueError(f"prepull_images: only a rented pool (provider aws, gcp, libcloud) boots "
                             f"its nodes from onepool's script; pull images on {self.provider} nodes "
                             "yourself")
        if (self.provider == "slurm") != (self.slurm is not None):
            raise ValueError("slurm: a slurm pool needs a `slurm:` section naming its partition, e.g. "
                             "slurm: {partition: gpu}" if self.provider == "slurm" else
                             f"slurm: only a pool with provider slurm has a `slurm:` section (got "
                             f"provider {self.provider!r})")
        if self.provider == "slurm":
            if self.market != Market.ONPREM:
                raise ValueError(f"market: a slurm pool is onprem (charged amortized), got "
                                 f"{self.market.value}")
            if self.max_nodes is not None:
                raise ValueError("max_nodes: a slurm pool does not grow; its nodes come from the partition")
            return self
        if self.provider in ("local", "agent"):
            if self.max_nodes is not None:
                raise ValueError("max_nodes: only rented pools (provider aws, gcp, libcloud) grow; "
                                 f"set nodes for a {self.provider} pool")
            return self
        if self.market == Market.ONPREM:
            raise ValueError(f"market: a {self.provider} pool is on_demand or spot (got onprem)")
        if self.max_nodes is None or not self.instance_type:
            raise ValueError(f"a {self.provider} pool needs max_nodes and instance_type")
        if self.nodes:
            raise ValueError("nodes: must be 0 for a rented pool (the broker launches up to max_nodes)")
        from providers.options import check_pool

        check_pool(self)  # options, image and name, per provider (issue 15)
        return self

    @property
    def rented(self) -> bool:
        return self.max_nodes is not None
    # On-prem: what a GPU-hour costs, charged in the ledger but free for placement. Either a
    # typed rate, or `amortize` (purchase price, years, power, hosting; issue 13). Neither:
    # price_per_node_hour / gpus_per_node.
    amortized_usd_per_gpu_hour: float | None = Field(default=None, ge=0.0)
    amortize: OnpremCost | None = None

    @model_validator(mode="after")
    def _onprem_cost(self) -> PoolSpec:
        if self.amortize is None and self.amortized_usd_per_gpu_hour is None:
            return self
        if self.market is not Market.ONPREM:
            raise ValueError(f"amortize / amortized_usd_per_gpu_hour: only on-prem pools are amortized "
                             f"(this one is {self.market.value}: set price_per_node_hour)")
        if self.amortize is not None and self.amortized_usd_per_gpu_hour is not None:
            raise ValueError("give amortize (purchase price, years, power, hosting) or "
                             "amortized_usd_per_gpu_hour, not both")
        return self

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, v: str) -> str:
        from providers import KNOWN_PROVIDERS

        if v not in KNOWN_PROVIDERS:
            raise ValueError(f"must be one of {', '.join(sorted(KNOWN_PROVIDERS))} (got {v!r})")
        return v

    @field_validator("store")
    @classmethod
    def _store_uri(cls, v: str | None) -> str | None:
        return None if v is None else store_uri(v)


def runs_images(pool: PoolSpec) -> bool:
    """Whether a job's `image` can run on this pool: any pool whose nodes run onepool's
    supervisor (podman or docker, found on the node), a Slurm pool only when it names its
    container plug-in."""
    return pool.provider != "slurm" or pool.container_runtime is not None



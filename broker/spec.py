"""Validated user input: the cluster config (`onepool.yaml`) and the job spec.

Every public loader raises `SpecError` whose lines name the field path and what is allowed,
e.g. ``jobs.priority: must be one of urgent, high, normal, low (got 'vip')``.

The one config source: its building blocks (names, priorities, markets, the strict base
model) are in broker.spec_types, the `broker:` section in broker.spec_broker; both are
re-exported here, and the rest of the code imports them from broker.spec.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from broker.errors import SpecError
from broker.spec_broker import (
    LEGACY_TASK_KEYS,
    BrokerSettings,
    PolicySettings,
    RebalanceSettings,
    TaskIntervals,
    store_uri,
)
from broker.spec_code import Shipping
from broker.spec_types import (
    MAX_GPU_TYPES,
    MAX_ID,
    MAX_LOG_OFFSET,
    MAX_PATH,
    MAX_PID,
    NAME_HELP,
    NAME_RE,
    NODE_RUNTIMES,
    PRIORITIES_BY_RANK,
    QUOTA_TOTAL,
    SLURM_RUNTIMES,
    ContainerRuntime,
    DbId,
    LogOffset,
    Market,
    Name,
    Priority,
    QuotaSpec,
    SpotPolicy,
    _Strict,
    check_argv,
    check_env,
    check_quotas,
    image_ref,
    parse_deadline,
)
from broker.spec_workflow import Workflow

# broker.spec is the one config source the rest of the code imports, its parts included.
__all__ = [
    "LEGACY_TASK_KEYS", "MAX_ID", "MAX_LOG_OFFSET", "MAX_PID", "NAME_HELP", "NAME_RE", "PRIORITIES_BY_RANK",
    "QUOTA_TOTAL", "BrokerSettings", "ClusterConfig", "DbId", "JobSpec", "LogOffset", "Market", "Name",
    "OnpremCost", "PolicySettings", "PoolSpec", "Priority", "QuotaSpec",
    "RebalanceSettings", "SlurmSpec", "SpotPolicy", "TaskIntervals", "TeamSpec",
    "check_job_fits", "check_quotas", "load_config", "market_ok", "parse_config", "parse_job", "read_yaml",
    "store_uri", "unreachable_stores", "validate",
]


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


BudgetWindow = Literal["day", "week", "month", "total"]  # calendar windows, UTC


SECRET_FIELDS = ("webhook_url", "webhook_secret")  # never echoed in an error


def webhook_url(v: str | None) -> str | None:
    """A team's or a job's webhook URL: http(s) only. Raises ValueError (without the value)."""
    if v is not None and not re.match(r"^https?://[^\s/]+\S*$", v):
        raise ValueError("must be an http:// or https:// URL")
    return v


def webhook_signed(url: str | None, secret: str | None) -> None:
    """Raises ValueError when a webhook URL comes without the secret that signs its deliveries."""
    if url and not secret:
        raise ValueError("webhook_secret: required with webhook_url (at least 16 characters; "
                         "deliveries are signed with it)")


class TeamSpec(_Strict):
    """A team: its fair-share weight and how many GPUs it may hold at high/urgent."""

    name: Name
    weight: float = Field(default=1.0, gt=0.0)
    priority_allowance_gpus: int = Field(default=8, ge=0)
    # Money (issue 6): a windowed budget. Below `budget_low_fraction` of it left, the team's
    # new work goes spot-only and loses its urgent allowance; at zero its jobs stop.
    budget_usd: float | None = Field(default=None, ge=0.0)
    budget_window: BudgetWindow = "month"
    budget_low_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    # Notifications (issue 30, broker.control.notify): a Slack-compatible webhook that hears of
    # the team's jobs ending, failing, preempted or interrupted, and its budget running low or
    # out. Both are secrets: never logged.
    webhook_url: str | None = Field(default=None, max_length=2000)
    webhook_secret: str | None = Field(default=None, min_length=16, max_length=200)
    # Quotas (issue 28, broker.policy.quota): nominal GPUs, borrowing and lending limits.
    quota: QuotaSpec | None = None

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return webhook_url(v)

    @model_validator(mode="after")
    def _signed(self) -> TeamSpec:
        webhook_signed(self.webhook_url, self.webhook_secret)
        return self


class ClusterConfig(_Strict):
    """The whole `onepool.yaml`."""

    pools: list[PoolSpec] = Field(min_length=1)
    teams: list[TeamSpec] = Field(min_length=1)
    broker: BrokerSettings = BrokerSettings()

    @model_validator(mode="after")
    def _agents_reach_server(self) -> ClusterConfig:
        rented = [p.name for p in self.pools if p.rented]
        if rented and not self.broker.server_url:
            raise ValueError(f"broker.server_url: required when a pool rents nodes ({', '.join(rented)}): "
                             "the URL at which their agents reach `onepool server`, e.g. "
                             "http://10.0.0.5:8421 (got none)")
        return self

    @model_validator(mode="after")
    def _cloud_names(self) -> ClusterConfig:
        from providers.options import check_pools

        problems = check_pools(self.pools)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _quotas(self) -> ClusterConfig:
        problems = check_quotas({t.name: t.quota for t in self.teams if t.quota is not None},
                                self.gpu_types())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterConfig:
        for what, items in (("pools", self.pools), ("teams", self.teams)):
            seen: set[str] = set()
            for it in items:
                if it.name in seen:
                    raise ValueError(f"{what}: duplicate name {it.name!r}")
                seen.add(it.name)
        return self

    def gpu_types(self) -> list[str]:
        return sorted({p.gpu_type for p in self.pools})

    def pool(self, name: str) -> PoolSpec:
        return next(p for p in self.pools if p.name == name)


DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0


def checkpoint_interval(v: Any) -> float | str:
    """A job's checkpoint_interval_s: "auto", or seconds (a number > 0; a numeric string is
    read as one). Raises ValueError naming the allowed values."""
    if isinstance(v, str):
        if v.strip().lower() == "auto":
            return "auto"
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"must be a number of seconds > 0 or 'auto' (got {_short(v)})") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"must be a number of seconds > 0 or 'auto' (got {_short(v)})")
    return float(v)


class JobSpec(Workflow, Shipping):
    """What a user submits. `command` is an argv list (a string is split with shlex). Arrays,
    sweeps, dependencies and retries: see broker.spec_workflow.Workflow (issue 29); its code,
    setup and data: broker.spec_code.Shipping (issue 26).

    Sizes are bounded (broker.spec_types: MAX_ARG_BYTES, MAX_ARGV_BYTES, MAX_ENV_*, MAX_PATH,
    MAX_GPU_TYPES), below what Linux can start, so a spec the broker stores can be run; a spec
    over a limit is refused at submit, naming the field and the limit."""

    name: Name
    team: Name
    command: list[str] = Field(min_length=1)
    experiment: Name = "default"
    env: dict[str, str] = Field(default_factory=dict)
    # where the command runs; default: where it was submitted from
    workdir: str | None = Field(default=None, max_length=MAX_PATH)
    # an OCI image each rank runs in (issue 26; providers.container); None: on the node itself
    image: str | None = None
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=1024)
    gpu_types: list[Annotated[str, Field(max_length=40)]] = Field(
        default_factory=list, max_length=MAX_GPU_TYPES)  # empty: any type
    priority: Priority = Priority.NORMAL
    budget_usd: float | None = Field(default=None, ge=0.0)
    spot: SpotPolicy = SpotPolicy.ALLOWED
    # seconds, or "auto": the broker advises it from measured save times and stop rates
    # (broker.policy.intervals) and hands it to each attempt at its start
    checkpoint_interval_s: float | Literal["auto"] = DEFAULT_CHECKPOINT_INTERVAL_S
    expected_duration_s: float | None = Field(default=None, gt=0.0)
    # finish by then (broker.policy.deadlines): an ISO time with its zone, or a duration from
    # the submission (broker.spec_types.DEADLINE_HELP)
    deadline: str | None = Field(default=None, max_length=100)
    # Its own webhook (issue 30, broker.control.notify): hears of this job's end, failure,
    # preemption and interruption, besides its team's. Secrets: never shown or logged.
    webhook_url: str | None = Field(default=None, max_length=2000)
    webhook_secret: str | None = Field(default=None, min_length=16, max_length=200)

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        return webhook_url(v)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return image_ref(v)

    @model_validator(mode="after")
    def _webhook_signed(self) -> JobSpec:
        webhook_signed(self.webhook_url, self.webhook_secret)
        return self

    @field_validator("checkpoint_interval_s", mode="before")
    @classmethod
    def _interval(cls, v: Any) -> Any:
        return checkpoint_interval(v)

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_deadline(v)
            except ValueError as e:
                raise ValueError(str(e).removeprefix("deadline: ")) from None
        return v

    def deadline_at(self, submitted: float) -> float | None:
        """The deadline in epoch seconds for a job submitted at `submitted` (None: none)."""
        if self.deadline is None:
            return None
        kind, v = parse_deadline(self.deadline)
        return submitted + v if kind == "in" else v

    @property
    def checkpoint_auto(self) -> bool:
        return self.checkpoint_interval_s == "auto"

    @property
    def interval_hint_s(self) -> float:
        """The interval in seconds; for "auto", the default until the broker advises one."""
        v = self.checkpoint_interval_s
        return DEFAULT_CHECKPOINT_INTERVAL_S if v == "auto" else v

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("command")
    @classmethod
    def _argv_size(cls, v: list[str]) -> list[str]:
        return check_argv(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        check_env(v)
        for k in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise ValueError(f"variable name {k!r} is not a valid environment name")
            if k.startswith("ONEPOOL_") or k == "CUDA_VISIBLE_DEVICES":
                raise ValueError(f"{k} is set by the broker and cannot be overridden")
        return v

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def _format(err: ValidationError, prefix: str = "") -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "enum":
            allowed = e.get("ctx", {}).get("expected", "")
            msg = f"must be one of {allowed.replace(' or ', ', ')}"
        elif e["type"] == "string_pattern_mismatch":
            msg = f"must be {NAME_HELP}"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        elif e["type"] == "finite_number":
            msg = "must be a finite number"
        elif msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
        got = e.get("input")
        quiet = e["type"] in ("missing", "extra_forbidden") or "(got" in msg
        shown = "" if quiet else f" (got {_short(got)})"
        if isinstance(got, dict | list) or (e["loc"] and e["loc"][-1] in SECRET_FIELDS):
            shown = ""
        out.append(f"{prefix}{loc}: {msg}{shown}")
    return out


def _short(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (an error does not echo a 100 KB input back)."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


def parse_config(data: Any, source: str = "onepool.yaml") -> ClusterConfig:
    """Validate a config mapping. Raises SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError(source, ["(root): must be a mapping with 'pools' and 'teams'"])
    return validate(ClusterConfig, data, source)


def read_yaml(path: str | Path) -> Any:
    """The parsed content of a YAML file. Raises SpecError naming the file when it cannot be
    read or is not valid YAML."""
    p = Path(path)
    try:
        return yaml.safe_load(p.read_text())
    except OSError as e:
        raise SpecError(str(p), [f"cannot read the file: {e.strerror}"]) from None
    except yaml.YAMLError as e:
        raise SpecError(str(p), [f"not valid YAML: {e}"]) from None


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, source: str) -> M:
    """model.model_validate(data), with errors as a SpecError naming every bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, _format(e)) from None


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate an onepool.yaml file. Raises SpecError (bad content or unreadable file)."""
    return parse_config(read_yaml(path), str(path))


def parse_job(data: Any, config: ClusterConfig | None = None, source: str = "job") -> JobSpec:
    """Validate a job spec mapping, and (given the config) that it can ever run there.

    Raises SpecError naming the field and the allowed values: an unknown team lists the
    teams, an unknown GPU type lists the configured types, a shape no pool can hold says so.
    """
    if not isinstance(data, dict):
        raise SpecError(source, ["(root): must be a mapping of job fields"])
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, _format(e)) from None
    if config is not None:
        check_job_fits(spec, config, source)
    return spec


def check_job_fits(spec: JobSpec, config: ClusterConfig, source: str = "job") -> None:
    """Raise SpecError unless the job's team exists and some pool could ever hold it."""
    problems: list[str] = []
    teams = [t.name for t in config.teams]
    if spec.team not in teams:
        problems.append(f"team: must be one of {', '.join(teams)} (got {spec.team!r})")
    known = config.gpu_types()
    bad = [t for t in spec.gpu_types if t not in known]
    if bad:
        problems.append(f"gpu_types: {', '.join(map(repr, bad))} not in any pool; "
                        f"allowed: {', '.join(known)}")
    if not problems:
        ok_type = [p for p in config.pools if not spec.gpu_types or p.gpu_type in spec.gpu_types]
        ok_market = [p for p in ok_type if market_ok(spec.spot, p.market)]
        fits = [p for p in ok_market if p.gpus_per_node >= spec.gpus_per_node
                and max(p.nodes, p.max_nodes or 0) >= spec.nodes]
        if spec.image and fits and not any(runs_images(p) for p in fits):
            names = ", ".join(p.name for p in fits)
            problems.append(f"image: no pool that fits this job runs container images ({names}: "
                "Slurm pools without a container_runtime); declare the "
                "Slurm pool's container plug-in (container_runtime: pyxis or apptainer) or submit "
                "without an image")
        if not ok_market:
            problems.append(f"spot: no pool of an acceptable type matches spot={spec.spot.value}")
        elif not fits:
            shapes = ", ".join(f"{p.name}: {p.nodes}x{p.gpus_per_node} {p.gpu_type}"
                               for p in ok_market)
            problems.append(
                f"gpus_per_node/nodes: {spec.nodes} node(s) x {spec.gpus_per_node} GPUs fits "
                f"no pool of an acceptable type ({shapes})")
    if problems:
        raise SpecError(source, problems)


def runs_images(pool: PoolSpec) -> bool:
    """Whether a job's `image` can run on this pool: any pool whose nodes run onepool's
    supervisor (podman or docker, found on the node), a Slurm pool only when it names its
    container plug-in."""
    return pool.provider != "slurm" or pool.container_runtime is not None


def unreachable_stores(cfg: ClusterConfig) -> list[str]:
    """One problem per pool whose nodes are not the server (agent, rented, Slurm) but whose
    checkpoints go to a file:// store (its own, broker.checkpoint_store, or by default the
    server's home) not declared `store_shared`: its nodes cannot reach that folder, so a job
    preempted on one node would resume on another from nothing. `onepool apply` refuses them."""
    problems = []
    for i, p in enumerate(cfg.pools):
        uri = p.store or cfg.broker.checkpoint_store
        if p.provider == "local" or p.store_shared or (uri is not None and not uri.startswith("file://")):
            continue
        where = uri or "file://$ONEPOOL_HOME/checkpoints on the server (the default)"
        problems.append(
            f"pools[{i}] ({p.name}): its nodes (provider {p.provider}) are not the server, but its "
            f"checkpoints go to {where}, which they cannot reach: set the pool's store (or "
            "broker.checkpoint_store) to a bucket every node reaches (s3://..., gs://...), or add "
            "`store_shared: true` to the pool if that folder is on a filesystem every node mounts")
    return problems


def market_ok(spot: SpotPolicy, market: Market) -> bool:
    """Whether a job with this spot policy may run on this market.

    The spot policy is about *rented* capacity: on-prem is always acceptable; `never` excludes
    spot, `only` excludes on-demand, `allowed` takes either.
    """
    if market is Market.ONPREM:
        return True
    if spot is SpotPolicy.NEVER:
        return market is not Market.SPOT
    if spot is SpotPolicy.ONLY:
        return market is Market.SPOT
    return True

"""Validated user input: the cluster config (`onepool.yaml`) and the job spec.

Every public loader raises `SpecError` whose lines name the field path and what is allowed,
e.g. ``jobs.priority: must be one of urgent, high, normal, low (got 'vip')``.

The one config source: its building blocks (names, priorities, markets, the strict base
model) are in broker.spec_types, the `broker:` section in broker.spec_broker, the pools in
broker.spec_pools, the job spec in broker.spec_job; all are re-exported here, and the rest of
the code imports them from broker.spec. This module holds the teams, the whole config, the
loaders and error formatting, and the checks that need the whole config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from broker.errors import SpecError
from broker.spec_broker import (
    LEGACY_TASK_KEYS,
    BrokerSettings,
    PolicySettings,
    RebalanceSettings,
    TaskIntervals,
    store_uri,
)
from broker.spec_job import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    SECRET_FIELDS,
    JobSpec,
    _short,
    checkpoint_interval,
    webhook_signed,
    webhook_url,
)
from broker.spec_pools import OnpremCost, PoolSpec, SlurmSpec, runs_images
from broker.spec_types import (
    MAX_ID,
    MAX_LOG_OFFSET,
    MAX_PID,
    NAME_HELP,
    NAME_RE,
    PRIORITIES_BY_RANK,
    QUOTA_TOTAL,
    DbId,
    LogOffset,
    Market,
    Name,
    Priority,
    QuotaSpec,
    SpotPolicy,
    _Strict,
    check_quotas,
)

# broker.spec is the one config source the rest of the code imports, its parts included.
__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_S", "LEGACY_TASK_KEYS", "MAX_ID", "MAX_LOG_OFFSET", "MAX_PID", "NAME_HELP",
    "NAME_RE", "PRIORITIES_BY_RANK", "QUOTA_TOTAL", "SECRET_FIELDS", "BrokerSettings", "ClusterConfig",
    "DbId", "JobSpec", "LogOffset", "Market", "Name", "OnpremCost", "PolicySettings", "PoolSpec", "Priority",
    "QuotaSpec", "RebalanceSettings", "SlurmSpec", "SpotPolicy", "TaskIntervals", "TeamSpec",
    "check_job_fits", "check_quotas", "checkpoint_interval", "load_config", "market_ok", "parse_config",
    "parse_job", "read_yaml", "runs_images", "store_uri", "unreachable_stores", "validate",
    "webhook_signed", "webhook_url",
]


BudgetWindow = Literal["day", "week", "month", "total"]  # calendar windows, UTC

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

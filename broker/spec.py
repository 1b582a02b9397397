"""Validated user input: the cluster config (`onepool.yaml`) and the job spec.

Every public loader raises `SpecError` whose lines name the field path and what is allowed,
e.g. ``jobs.priority: must be one of urgent, high, normal, low (got 'vip')``.
"""

from __future__ import annotations

import re
import shlex
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from broker.errors import SpecError

NAME_RE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
NAME_HELP = "lowercase letters, digits, '_', '.', '-' (1-63 chars, starting with a letter or digit)"


class Priority(StrEnum):
    """Priority classes, highest first. `rank` orders them: urgent=3 ... low=0."""

    URGENT = "urgent"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Priority.URGENT: 3, Priority.HIGH: 2, Priority.NORMAL: 1, Priority.LOW: 0}
PRIORITIES_BY_RANK = sorted(Priority, key=lambda p: -_RANK[p])


class SpotPolicy(StrEnum):
    """Whether a job may run on spot capacity."""

    NEVER = "never"
    ALLOWED = "allowed"
    ONLY = "only"


class Market(StrEnum):
    """How a pool's capacity is paid for."""

    ONPREM = "onprem"
    ON_DEMAND = "on_demand"
    SPOT = "spot"


Name = Annotated[str, Field(pattern=NAME_RE)]


class _Strict(BaseModel):
    """Every input model: unknown fields, NUL bytes and non-finite numbers (inf, nan, 1e400)
    are refused, naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        where = _nul_in(v)
        if where is not None:
            raise ValueError(f"must not contain a NUL byte (\\x00){where}")
        return v


def _nul_in(v: Any, path: str = "") -> str | None:
    """Where in `v` (a string, or lists/dicts of them) a NUL byte is: "" for `v` itself,
    " in KEY" inside a mapping or list; None if there is none."""
    if isinstance(v, str):
        return path if "\x00" in v else None
    if isinstance(v, dict):
        for k, x in v.items():
            hit = _nul_in(str(k), f" in key {str(k)!r}") or _nul_in(x, f" in {str(k)!r}")
            if hit is not None:
                return hit
    if isinstance(v, list | tuple):
        for i, x in enumerate(v):
            hit = _nul_in(x, f" in item {i}")
            if hit is not None:
                return hit
    return None


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

    @model_validator(mode="after")
    def _rented(self) -> PoolSpec:
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


class RebalanceSettings(_Strict):
    """Scheduled rebalancing (issue 12; the rules: broker.policy.rebalance and .defrag).

    Every `broker.tasks.rebalance_s` the leader looks for moves that pay for themselves: a
    move must save at least `min_saving_usd` beyond its cost, at most `max_moves` start per
    round, and a move whose checkpoint is not committed `checkpoint_wait_s` after the request
    is given up (the job keeps running where it is). Gang jobs waiting `defrag_after_s` may
    have small jobs moved for them. `enabled: false` turns both off (`onepool rebalance
    --dry-run` still shows what it would do)."""

    enabled: bool = True
    min_saving_usd: float = Field(default=1.0, ge=0.0)
    max_moves: int = Field(default=4, ge=0, le=1000)
    checkpoint_wait_s: float = Field(default=600.0, gt=0.0, le=86400.0)
    defrag_after_s: float = Field(default=1800.0, ge=0.0)


class TaskIntervals(_Strict):
    """How often the leader runs each periodic task, in seconds (`broker.tasks:` in
    onepool.yaml; broker.control.scheduled runs them on APScheduler). Defaults by what a late
    run costs:

    - enforce_budgets_s (30): a job or team over its budget keeps spending until the next
      run; 30 s of an 8-GPU on-demand node is well under a dollar.
    - scale_down_s (30): an idle rented node is given back up to this long after its pool's
      idle_timeout_s (default 600 s): at most 5% more idle time, billed by the second.
    - rebalance_s (300): a move pays only over hours of remaining run time; minutes of delay
      change little, and each round plans the whole cluster.
    - sweep_orphans_s (300): a leaked instance is rare (a crash between a launch and its
      answer) and each sweep lists every pool's instances.
    - decay_fair_share_s (300): usage halves over fair_share_half_life_s (days); between
      runs it is carried forward at the teams' current GPU counts (broker.control.snapshots).
    - refresh_prices_s (900): spot prices move over hours; the clouds' price APIs are paged
      and throttled.
    - retain_checkpoints_s (3600): deleting old checkpoints frees storage, which is billed
      by the month; checkpoint_delete_delay_s (default 1 h) already delays every deletion.
    """

    refresh_prices_s: float = Field(default=900.0, ge=1.0, le=86400.0)
    rebalance_s: float = Field(default=300.0, ge=1.0, le=86400.0)
    scale_down_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    sweep_orphans_s: float = Field(default=300.0, ge=1.0, le=86400.0)
    enforce_budgets_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    decay_fair_share_s: float = Field(default=300.0, ge=1.0, le=86400.0)
    retain_checkpoints_s: float = Field(default=3600.0, ge=1.0, le=86400.0)


# Older spellings of task intervals, still accepted: (where it was, its `tasks` field).
LEGACY_TASK_KEYS = (("price_refresh_s", "refresh_prices_s"), ("orphan_sweep_s", "sweep_orphans_s"),
                    ("rebalance.interval_s", "rebalance_s"))


def _legacy_task_keys(data: Any) -> Any:
    """Move `broker.price_refresh_s`, `broker.orphan_sweep_s` and `broker.rebalance.interval_s`
    (the spellings before `broker.tasks`) to their `tasks` fields. Raises ValueError naming
    both when one is given both ways."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    tasks = data.get("tasks", {})
    if not isinstance(tasks, dict):
        return data  # the field's own validation says what is wrong
    tasks = dict(tasks)
    for old, new in LEGACY_TASK_KEYS:
        outer, _, inner = old.rpartition(".")
        holder = data
        if outer:
            if not isinstance(data.get(outer), dict) or inner not in data[outer]:
                continue
            holder = data[outer] = dict(data[outer])
        if inner not in holder:
            continue
        if new in tasks:
            raise ValueError(f"tasks.{new}: also given as {old} (its older name); keep only "
                             f"tasks.{new}")
        tasks[new] = holder.pop(inner)
    if tasks:
        data["tasks"] = tasks
    return data


class PolicySettings(_Strict):
    """The scheduling policy's knobs, written once: onepool.yaml's `broker:` section and a
    simulation scenario both hold them, and `broker.policy.PolicyConfig.from_settings` turns
    either into the policy's configuration. Times in seconds.

    - grace_s: SIGTERM -> this long to checkpoint and exit -> SIGKILL
    - min_run_s: a job preempted before is safe from preemption this long after it restarts
    - cloud_after_wait_s: non-urgent jobs wait this long before nodes are rented for them
    - restart_overhead_s: what a resumed attempt spends before it makes progress (assumed)
    - checkpoint_on_signal: the share of jobs that save a checkpoint when signalled (the rest
      lose the work since their last periodic checkpoint); the policy's loss estimates use it
    - fair_share_half_life_s: how fast past usage is forgotten in the fair-share order
    - reservations: how many blocked jobs (in queue order) get a reservation; a reservation
      holds GPUs only against jobs that would not finish before its estimated start (EASY)
    - promote_after_s: a multi-node job waiting this long is scheduled one class higher
      (never above high); None: off
    - preempt_after_s: a job below high preempts only once it has waited this long since it
      was submitted (most find capacity meanwhile; high/urgent preempt at once); 0: at once
    - checkpoint_align_s: a job below high waits up to this long for its victims' next
      periodic checkpoints, when they would otherwise lose unsaved work; 0: never
    """

    grace_s: float = Field(default=60.0, ge=0.0, le=3600)
    min_run_s: float = Field(default=300.0, ge=0.0)
    cloud_after_wait_s: float = Field(default=600.0, ge=0.0)
    restart_overhead_s: float = Field(default=180.0, ge=0.0)
    checkpoint_on_signal: float = Field(default=0.5, ge=0.0, le=1.0)
    fair_share_half_life_s: float = Field(default=7 * 86400.0, gt=0.0)
    reservations: int = Field(default=1, ge=0, le=10_000)
    promote_after_s: float | None = Field(default=None, gt=0.0)
    preempt_after_s: float = Field(default=900.0, ge=0.0)
    checkpoint_align_s: float = Field(default=900.0, ge=0.0)


class BrokerSettings(PolicySettings):
    """Knobs of the live broker (the policy's are inherited from PolicySettings). Times in
    seconds."""

    cycle_s: float = Field(default=2.0, gt=0.0, le=3600)
    checkpoint_store: str | None = None  # default: file://$ONEPOOL_HOME/checkpoints
    keep_checkpoints: int = Field(default=3, ge=1)  # newest committed checkpoints kept per job
    # Retention waits this long before deleting a checkpoint that fell out of the newest
    # `keep_checkpoints`, or a step folder that has had no manifest (an abandoned upload).
    checkpoint_delete_delay_s: float = Field(default=3600.0, ge=0.0)
    # Money (issue 6): who pays for idle rented node time ("pool": nobody's jobs; "launcher":
    # the team whose job triggered the launch), and what a submission whose estimate exceeds
    # its budget gets ("spot_only": queued spot-only if a spot pool fits the budget, else refused).
    idle_charged_to: Literal["pool", "launcher"] = "pool"
    over_budget_submission: Literal["refuse", "spot_only"] = "spot_only"
    # One leader (issue 10): the leader renews its lease every cycle and at least every
    # lease_s / 3; a standby takes over lease_s after the leader's last renewal (at once when
    # the dead leader ran on the same host). Kubernetes' leader election uses 15 s too.
    lease_s: float = Field(default=15.0, ge=1.0, le=3600)
    # Agents (issue 9). The URL at which agents on rented instances reach `onepool server`
    # (required when a pool rents nodes); a node whose agent has not been heard from for
    # `node_lost_after_s` is lost (its attempts requeue; a rented instance is terminated);
    # agents call in at least every `agent_heartbeat_s`. `agent_package` is the pip
    # requirement the boot script installs when the image has no `onepool` command.
    server_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    node_lost_after_s: float = Field(default=30.0, ge=3.0, le=3600.0)
    agent_heartbeat_s: float = Field(default=5.0, ge=0.5, le=600.0)
    agent_package: str | None = Field(default=None, min_length=1, max_length=500)
    # Periodic tasks (issue 12; broker.control.scheduled, run by the leader on APScheduler
    # with its job store in this database): refresh prices, rebalance (as `rebalance` says),
    # scale down idle rented nodes, sweep orphan instances (tagged with this broker, claimed
    # by no live node), enforce budgets, decay fair-share usage, checkpoint retention, each
    # every `tasks.<name>_s`. A task that fails is logged and runs again at its next time.
    tasks: TaskIntervals = TaskIntervals()
    rebalance: RebalanceSettings = RebalanceSettings()

    @model_validator(mode="before")
    @classmethod
    def _older_task_keys(cls, data: Any) -> Any:
        return _legacy_task_keys(data)

    @model_validator(mode="after")
    def _agent_timing(self) -> BrokerSettings:
        if self.agent_heartbeat_s * 3 > self.node_lost_after_s:
            raise ValueError(f"node_lost_after_s: must be at least 3 x agent_heartbeat_s "
                             f"({3 * self.agent_heartbeat_s:g}s), so one slow heartbeat does not "
                             f"lose a node (got {self.node_lost_after_s:g})")
        return self

    @field_validator("checkpoint_store")
    @classmethod
    def _store_uri(cls, v: str | None) -> str | None:
        return None if v is None else store_uri(v)


def store_uri(v: str) -> str:
    """A checkpoint store root URI, without a trailing slash. Raises ValueError if it has no scheme."""
    v = v.strip().rstrip("/")
    if not re.match(r"^[a-z][a-z0-9+.-]*://.+", v):
        raise ValueError(f"must be a URI like file:///data/ckpt, s3://bucket/prefix or "
                         f"gs://bucket/prefix (got {v!r})")
    return v


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


class JobSpec(_Strict):
    """What a user submits. `command` is an argv list (a string is split with shlex)."""

    name: Name
    team: Name
    command: list[str] = Field(min_length=1)
    experiment: Name = "default"
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None  # where the command runs; default: where it was submitted from
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=1024)
    gpu_types: list[str] = Field(default_factory=list)  # empty: any type
    priority: Priority = Priority.NORMAL
    budget_usd: float | None = Field(default=None, ge=0.0)
    spot: SpotPolicy = SpotPolicy.ALLOWED
    checkpoint_interval_s: float = Field(default=1800.0, gt=0.0)
    expected_duration_s: float | None = Field(default=None, gt=0.0)

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
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
        shown = "" if e["type"] in ("missing", "extra_forbidden") or "(got" in msg else f" (got {got!r})"
        if isinstance(got, dict | list):
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


def validate(model: type[BaseModel], data: Any, source: str) -> Any:
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

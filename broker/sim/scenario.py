"""A simulation scenario: the cluster, and what the trace lacks, assigned deterministically.

Assignment rules (all by a stable hash, so the same trace and seed give the same run):
- team: by the job's `queue` through `teams[].queues`; unmatched queues go to `default_team`.
  A team's weight, if not given, is its share of the trace's GPU-hours (documented in the
  output), and its high/urgent allowance, if not given, is `priority_allowance_fraction` of
  its weighted share of the on-prem GPUs.
- priority class: u = hash(seed, "class", job_id) in [0, 1); classes are taken in the order
  urgent, high, normal, low with the `classes` fractions as cumulative bands.
- acceptable GPU types: the same with salt "types" over `gpu_types` bands ("any" = every type).
- spot policy and budget: by class (`spot`, `budget_usd`).
- who checkpoints on the signal: u = hash(seed, "ckpt", job_id) < `checkpoint_on_signal`
  (default 0.5); the others lose their work back to their last periodic checkpoint.
- runtime estimates (`runtime_estimates`): "learned" (default; per team and experiment, where
  a trace job's experiment is its GPU count: broker.policy.estimates), "exact" (the trace's
  duration, as if every user gave a perfect expected_duration_s), or "none".

The policy knobs (grace_s, min_run_s, reservations, checkpoint_on_signal, ...) are the same
PolicySettings onepool.yaml's `broker:` section has; `policy:` overrides PolicyConfig fields
per compared policy.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from broker.spec import (
    Market,
    PolicySettings,
    Priority,
    QuotaSpec,
    SpotPolicy,
    check_quotas,
    read_yaml,
    validate,
)


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OnpremPool(_S):
    name: str
    gpu_type: str
    gpus_per_node: int = Field(ge=1, le=64)
    nodes: int = Field(ge=1)


class CloudPool(_S):
    name: str
    provider: str = "aws"
    gpu_type: str
    gpus_per_node: int = Field(ge=1, le=64)
    market: Market
    price_per_node_hour: float = Field(gt=0)
    on_demand_price_per_node_hour: float | None = Field(default=None, gt=0)
    max_nodes: int = Field(ge=1)
    launch_latency_s: float = Field(default=180.0, ge=0)
    interruption_rate_per_h: float = Field(default=0.0, ge=0)
    idle_timeout_s: float = Field(default=600.0, ge=0)
    # Stock-outs: the pool refuses launches for a while (spot capacity is not always there).
    # They start at this rate (exponential gaps, seeded) and last this long on average
    # (exponential); 0: always in stock.
    stockouts_per_day: float = Field(default=0.0, ge=0)
    stockout_mean_s: float = Field(default=7200.0, gt=0)
    source: str = ""  # where the price came from

    @model_validator(mode="after")
    def _on_demand_reference(self) -> CloudPool:
        if self.market is Market.ONPREM:
            raise ValueError("market: a cloud pool is on_demand or spot")
        if self.market is Market.SPOT and self.on_demand_price_per_node_hour is None:
            raise ValueError("on_demand_price_per_node_hour: required for spot pools "
                             "(the cost comparison needs it)")
        return self

    @property
    def on_demand_price(self) -> float:
        return self.on_demand_price_per_node_hour or self.price_per_node_hour


class TeamRule(_S):
    name: str
    queues: list[str] = Field(default_factory=list)
    weight: float | None = Field(default=None, gt=0)
    priority_allowance_gpus: int | None = Field(default=None, ge=0)
    # A budget over the whole replay (rented capacity its jobs used, at the pool's price):
    # broker.policy.budget's rules apply (low: spot-only, no urgent allowance; spent: hidden).
    budget_usd: float | None = Field(default=None, ge=0)
    budget_low_fraction: float = Field(default=0.2, ge=0, le=1)
    # Quotas (issue 28, broker.policy.quota): as a team's `quota:` in onepool.yaml.
    quota: QuotaSpec | None = None


class Scenario(PolicySettings):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    seed: int = 0
    onprem: list[OnpremPool] = Field(min_length=1)
    cloud: list[CloudPool] = Field(default_factory=list)
    teams: list[TeamRule] = Field(min_length=1)
    default_team: str
    priority_allowance_fraction: float = Field(default=0.3, ge=0)
    classes: dict[Priority, float]
    gpu_types: dict[str, float] = Field(default_factory=lambda: {"any": 1.0})
    spot: dict[Priority, SpotPolicy] = Field(default_factory=dict)
    budget_usd: dict[Priority, float] = Field(default_factory=dict)
    runtime_estimates: Literal["learned", "exact", "none"] = "learned"
    checkpoint_interval_s: float = Field(default=1800.0, gt=0)
    # fixed: every attempt saves every checkpoint_interval_s; advised: each gets the live
    # broker's advice at its start (broker.sim.intervals, `checkpoint_interval_s: auto` in a job)
    checkpoint_intervals: Literal["fixed", "advised"] = "fixed"
    # Deadlines (broker.sim.deadlines): the share of jobs (by hash) with one, at submission +
    # deadline_slack x their duration, and how they run: none (no deadlines), on_demand (never
    # spot), spot (only spot), aware (the live broker's rule, broker.policy.deadlines)
    deadlines: Literal["none", "on_demand", "spot", "aware"] = "none"
    deadline_fraction: float = Field(default=0.0, ge=0, le=1)
    deadline_slack: float = Field(default=2.0, gt=1)
    checkpoint_save_s: float = Field(default=30.0, ge=0)
    interruption_notice_s: float = Field(default=120.0, ge=0)
    cycle_s: float = Field(default=30.0, gt=0)
    onprem_usd_per_gpu_hour: float = Field(default=1.0, ge=0)
    drain_limit_s: float = Field(default=60 * 86400.0, gt=0)
    policy: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        for what, fr in (("classes", self.classes), ("gpu_types", self.gpu_types)):
            if abs(sum(fr.values()) - 1.0) > 1e-6:
                raise ValueError(f"{what}: fractions must sum to 1 (got {sum(fr.values()):g})")
        names = [t.name for t in self.teams]
        if self.default_team not in names:
            raise ValueError(f"default_team: must be one of {', '.join(names)}")
        if self.checkpoint_save_s > self.grace_s:
            raise ValueError("checkpoint_save_s: must be <= grace_s (a save must fit the grace)")
        pools = [p.name for p in self.onprem] + [p.name for p in self.cloud]
        if len(set(pools)) != len(pools):
            raise ValueError("pool names must be unique across onprem and cloud")
        problems = check_quotas({t.name: t.quota for t in self.teams if t.quota is not None},
                                self.gpu_type_names())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def onprem_gpus(self) -> int:
        return sum(p.gpus_per_node * p.nodes for p in self.onprem)

    def gpu_type_names(self) -> list[str]:
        return sorted({p.gpu_type for p in self.onprem} | {p.gpu_type for p in self.cloud})


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML. Raises SpecError naming the file and bad fields."""
    return validate(Scenario, read_yaml(path), str(path))


def unit_hash(seed: int, salt: str, key: str) -> float:
    """A stable number in [0, 1) for (seed, salt, key)."""
    h = hashlib.blake2b(f"{seed}:{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def pick_band(u: float, bands: list[tuple[Any, float]]) -> Any:
    """The band whose cumulative fraction covers u (the last band absorbs rounding)."""
    acc = 0.0
    for value, frac in bands:
        acc += frac
        if u < acc:
            return value
    return bands[-1][0]

"""Immutable inputs and outputs of the policy. Build them in three lines; plan() never mutates them.

Times are seconds on whatever clock the caller uses (the engine's injected clock, or the
simulator's); the policy only compares and subtracts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.spec import Market, Priority, SpotPolicy

Alloc = tuple[tuple[str, int], ...]
"""GPUs held per node: ((node_id, gpus), ...)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    id: str
    gpus: int


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool of identical nodes. `teams`, when set, restricts who may use it (a partition)."""

    name: str
    gpu_type: str
    gpus_per_node: int
    nodes: tuple[NodeView, ...]
    market: Market = Market.ONPREM
    price_per_gpu_hour: float = 0.0
    teams: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class RunningView:
    """One running attempt. `stopping_for` names the job a preemption is freeing it for."""

    attempt_id: int
    job_id: int
    team: str
    priority: Priority
    alloc: Alloc
    started_at: float
    submit_time: float
    last_checkpoint_at: float | None = None
    times_preempted: int = 0
    stopping: bool = False
    stopping_for: int | None = None

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.alloc)


@dataclass(frozen=True, slots=True)
class PendingView:
    job_id: int
    team: str
    priority: Priority
    gpus_per_node: int
    submit_time: float
    nodes: int = 1
    gpu_types: tuple[str, ...] = ()  # empty: any type
    spot: SpotPolicy = SpotPolicy.ALLOWED

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True, slots=True)
class TeamView:
    name: str
    weight: float = 1.0
    priority_allowance_gpus: int = 1 << 30
    usage: float = 0.0  # decayed GPU-seconds (see broker.policy.fairshare)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """A named configuration of the one policy. The baselines are settings, not other code.

    - classes: order by priority class (False: plain FIFO by submit time)
    - fair_share: within a class, order teams by decayed usage / weight
    - anti_capture: a team's high/urgent GPUs beyond its allowance are scheduled as normal
    - preemption: preempt strictly lower classes for a blocked job
    - victim_order: "checkpoint" (least work lost first) or "youngest" (ignores checkpoints)
    - min_run_s: a job preempted before is safe from preemption for this long after it restarts
    - backfill: later jobs may use capacity the blocked ones cannot
    - reservations: how many blocked jobs (in queue order) hold the capacity they wait for
    """

    classes: bool = True
    fair_share: bool = True
    anti_capture: bool = True
    preemption: bool = True
    victim_order: str = "checkpoint"
    min_run_s: float = 300.0
    backfill: bool = True
    reservations: int = 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    pools: tuple[PoolView, ...]
    running: tuple[RunningView, ...] = ()
    pending: tuple[PendingView, ...] = ()
    teams: tuple[TeamView, ...] = ()
    config: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: int
    pool: str
    alloc: Alloc
    priority: Priority  # effective class (after anti-capture demotion)


@dataclass(frozen=True, slots=True)
class Preemption:
    attempt_id: int
    job_id: int
    for_job_id: int
    lost_gpu_s: float  # work since the victim's last checkpoint, times its GPUs (estimate)


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[tuple[int, Alloc], ...] = ()  # (job_id, GPUs held for it per node)
    waiting: tuple[tuple[int, str], ...] = ()  # (job_id, why it is not placed)
    demoted: tuple[int, ...] = ()  # job ids scheduled as normal by anti-capture

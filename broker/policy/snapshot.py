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
    idle_since: float | None = None  # when it last became empty (None: in use, or unknown)
    used: int | None = None  # GPUs running attempts hold; None: plan() sums `running` itself.
    # When every node carries it, it must equal the sum of the running allocations on it.


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool of identical nodes. `teams`, when set, restricts who may use it (a partition).

    Rented pools can grow: `max_nodes` (None: fixed at `nodes`) bounds ready plus launching
    nodes; `launching` lists nodes on their way, as (for_job_id, count); a node is ready
    `launch_latency_s` after its launch. `interruption_rate_per_h` is the expected number of
    reclaims per node-hour (spot). Idle rented nodes are terminated after `idle_timeout_s`.
    """

    name: str
    gpu_type: str
    gpus_per_node: int
    nodes: tuple[NodeView, ...]
    market: Market = Market.ONPREM
    price_per_gpu_hour: float = 0.0
    teams: frozenset[str] | None = None
    max_nodes: int | None = None
    launching: tuple[tuple[int, int], ...] = ()
    launch_latency_s: float = 0.0
    interruption_rate_per_h: float = 0.0
    idle_timeout_s: float = 600.0

    @property
    def launchable(self) -> int:
        """How many more nodes may be launched now."""
        if self.max_nodes is None:
            return 0
        return max(0, self.max_nodes - len(self.nodes) - sum(n for _, n in self.launching))


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
    checkpoint_period_s: float | None = None  # periodic checkpoints every period after origin
    checkpoint_origin: float = 0.0
    gpus: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(g for _, g in self.alloc))

    def last_checkpoint(self, now: float) -> float | None:
        """The latest checkpoint time known: the recorded one, or the periodic schedule's."""
        t = self.last_checkpoint_at
        if self.checkpoint_period_s and now >= self.checkpoint_origin + self.checkpoint_period_s:
            k = (now - self.checkpoint_origin) // self.checkpoint_period_s
            periodic = self.checkpoint_origin + k * self.checkpoint_period_s
            t = periodic if t is None else max(t, periodic)
        return t


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
    budget_usd: float | None = None  # what is left of it
    expected_duration_s: float | None = None
    checkpoint_interval_s: float = 1800.0

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
    - cloud: launch rented nodes for blocked jobs (see broker.policy.cloud for the rules)
    - cloud_after_wait_s: a job must have waited this long before nodes are rented for it
      (high/urgent jobs: at once)
    - checkpoint_on_signal: victims checkpoint when signalled (the runtime does), so a
      preemption loses only the restart overhead, not the work since the last checkpoint
    - restart_overhead_s: time a resumed attempt spends before making progress
    - gpu_hour_value_usd: what a GPU-hour of lost work is worth (preempt-or-buy)
    - wait_value_usd_per_gpu_hour: what an hour of waiting costs a high/urgent job, per GPU
    - rent_horizon_s: how long a rental is assumed to last when a job has no expected duration
    - promote_after_s: aging; a job waiting this long since submission is scheduled one class
      higher (never above high; anti-capture still applies). None: off
    - promote_gangs_only: age only multi-node jobs (the ones backfill starves)
    """

    classes: bool = True
    fair_share: bool = True
    anti_capture: bool = True
    preemption: bool = True
    victim_order: str = "checkpoint"
    min_run_s: float = 300.0
    backfill: bool = True
    reservations: int = 4
    cloud: bool = True
    cloud_after_wait_s: float = 600.0
    checkpoint_on_signal: bool = True
    restart_overhead_s: float = 180.0
    gpu_hour_value_usd: float = 2.0
    wait_value_usd_per_gpu_hour: float = 20.0
    rent_horizon_s: float = 3600.0
    grace_s: float = 60.0
    promote_after_s: float | None = None
    promote_gangs_only: bool = True


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
class Launch:
    """Rent `count` nodes in `pool` for the job (whose queue place they are held for)."""

    pool: str
    count: int
    for_job_id: int
    usd_per_hour: float


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    launches: tuple[Launch, ...] = ()
    terminations: tuple[str, ...] = ()  # idle rented node ids to give back
    reservations: tuple[tuple[int, Alloc], ...] = ()  # (job_id, GPUs held for it per node)
    waiting: tuple[tuple[int, str], ...] = ()  # (job_id, why it is not placed)
    demoted: tuple[int, ...] = ()  # job ids scheduled as normal by anti-capture

"""Immutable inputs and outputs of the policy. Build them in three lines; plan() never mutates them.

Times are seconds on whatever clock the caller uses (the engine's injected clock, or the
simulator's); the policy only compares and subtracts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

from broker.policy.config import PolicyConfig
from broker.spec import Market, Priority, SpotPolicy

if TYPE_CHECKING:
    from broker.policy.free_index import FreeIndex
    from broker.policy.queue import PendingQueue
    from broker.policy.reclaim_index import ReclaimIndex

_COUNT = itemgetter(1)
Alloc = tuple[tuple[str, int], ...]
"""GPUs held per node: ((node_id, gpus), ...)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    id: str
    gpus: int
    idle_since: float | None = None  # when it last became empty (None: in use, or unknown)
    used: int | None = None  # GPUs running attempts hold; None: plan() sums `running` itself.
    # When every node carries it, it must equal the sum of the running allocations on it.
    # A node under an interruption notice takes no new work: see broker.policy.pools.draining.
    releases: tuple[tuple[float, int], ...] | None = None
    # (expected end, GPUs) of the attempts on it, soonest first, as broker.policy.backfill
    # reads them (an attempt whose GPUs go to the job it was preempted for: inf); None: plan()
    # derives them from `running`. A caller that keeps nodes across cycles saves the work.
    ready: tuple[float, ...] | None = None
    ready_until: float = 0.0
    # ready[g - 1]: when the node will have g free GPUs by `releases` (inf: not known to),
    # as broker.policy.backfill.ready_times computes it; valid before `ready_until` (then an
    # attempt counted on may have overrun its estimate). None: plan() computes it.


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool of identical nodes. `teams`, when set, restricts who may use it (a partition).

    Rented pools can grow: `max_nodes` (None: fixed at `nodes`) bounds ready plus launching
    nodes; `launching` lists nodes on their way, as (for_job_id, count); a node is ready
    `launch_latency_s` after its launch. `interruption_rate_per_h` is the expected number of
    reclaims per node-hour (spot). Idle rented nodes are terminated after `idle_timeout_s`.
    `closed`: the pool refused a launch lately and may not grow for now (its `max_nodes` is
    capped, see broker.policy.pools); work below high waits for a closed spot pool rather
    than renting on demand (broker.policy.cloud).
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
    closed: bool = False  # refused a launch lately (a stock-out): closed to launches for now

    @property
    def launchable(self) -> int:
        """How many more nodes may be launched now."""
        if self.max_nodes is None:
            return 0
        launching = self.launching
        return max(0, self.max_nodes - len(self.nodes)
                   - (sum(map(_COUNT, launching)) if launching else 0))


@dataclass(frozen=True, slots=True)
class RunningView:
    """One running attempt. `stopping_for` names the job a preemption is freeing it for.

    `expected_end`: when it is expected to finish (from its job's expected duration or a
    learned estimate, see broker.policy.estimates); None: unknown. An attempt still running
    past it is treated as unknown (an estimate is never trusted blindly).
    """

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
    expected_end: float | None = None
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
    expected_duration_s: float | None = None  # work left, estimated (None: unknown)
    checkpoint_interval_s: float = 1800.0
    # nodes it failed to start on for a reason that may be the node's (broker.policy.avoid)
    failed_on: frozenset[str] = frozenset()
    # nodes that hold its code snapshot already: preferred among equals (broker.policy.warm)
    warm_on: frozenset[str] = frozenset()

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """A team's quota (rules: broker.policy.quota). `nominal`: its guaranteed GPUs by quota
    key, a GPU type or "*" for every type, as ((key, GPUs), ...); `borrowing_limit`: GPUs it
    may use beyond its nominal, per key (None: no limit); `lending_limit`: GPUs of its unused
    nominal other teams may use, per key (None: all)."""

    nominal: tuple[tuple[str, int], ...]
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class TeamView:
    """A team's fair-share weight (0: best effort, ordered after every weighted team), its
    high/urgent allowance in GPUs, its decayed usage and its quota (None: none, so all it
    runs is borrowed, see broker.policy.quota)."""

    name: str
    weight: float = 1.0
    priority_allowance_gpus: int = 1 << 30
    usage: float = 0.0  # decayed GPU-seconds (see broker.policy.fairshare)
    quota: TeamQuota | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything plan() reads. `queue`, when given, must hold exactly `pending` (a caller
    that keeps one across cycles, like the simulator, saves plan() from rebuilding it); plan()
    only reads it. `free_index`, when given, must hold the free GPUs of exactly `pools`'
    nodes (see broker.policy.free_index.FreeIndex); `reclaim_index`, when given, must index
    exactly `running` (see broker.policy.reclaim_index.ReclaimIndex). plan() only reads them.
    None of them changes the plan, only how fast it is made."""

    now: float
    pools: tuple[PoolView, ...]
    running: tuple[RunningView, ...] = ()
    pending: tuple[PendingView, ...] = ()
    teams: tuple[TeamView, ...] = ()
    config: PolicyConfig = field(default_factory=PolicyConfig)
    queue: PendingQueue | None = field(default=None, compare=False, repr=False)
    free_index: FreeIndex | None = field(default=None, compare=False, repr=False)
    reclaim_index: ReclaimIndex | None = field(default=None, compare=False, repr=False)


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
    waiting: tuple[tuple[int, str], ...] = ()  # (job_id, why it is not placed); plan(explain=True)
    demoted: tuple[int, ...] = ()  # job ids scheduled as normal by anti-capture
    starts: tuple[tuple[int, float], ...] = ()  # (job_id, estimated start) of reservations
    wake_at: float | None = None  # the earliest time a time rule may change this plan

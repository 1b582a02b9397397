"""The simulator's mutable state: jobs, attempts, nodes and pools (private to broker.sim)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from broker.policy import NodeView, PendingView, PoolView, RunningView
from broker.policy.backfill import ready_times
from broker.policy.free_index import FreeIndex
from broker.policy.pools import draining
from broker.sim.trace import TraceJob
from broker.spec import Market, Priority, SpotPolicy


@dataclass
class SimJob:
    trace: TraceJob
    jid: int
    team: str
    cls: Priority
    types: tuple[str, ...]
    spot: SpotPolicy
    budget: float | None
    remaining: float
    queued_at: float
    saves_on_signal: bool = True  # checkpoints when signalled (a workload trait, by hash)
    wait: float = 0.0
    attempts: int = 0
    preemptions: int = 0
    first_start: float | None = None
    done_at: float | None = None
    last_cause: str | None = None  # what ended its previous attempt
    demoted: bool = False  # anti-capture scheduled it as normal at some point while it waited
    within_quota: bool = False  # its team's GPUs in use plus its own were within the team's quota
    view: PendingView | None = None  # while pending


@dataclass
class SimAttempt:
    job: SimJob
    view: RunningView
    pool: str
    progress_start: float
    finish_at: float
    stop_at: float | None = None  # signal/notice time
    saved_at_stop: float | None = None  # progress kept, when known at the signal
    cause: str | None = None
    interval_s: float = 1800.0  # its checkpoint interval (broker.sim.intervals)


@dataclass
class SimNode:
    id: str
    gpus: int
    used: int = 0
    idle_since: float | None = None
    launched_at: float = 0.0
    draining: bool = False  # under an interruption notice: takes no new work
    ends: dict[int, tuple[float, int]] = field(default_factory=dict)  # attempt -> (end, GPUs)
    view: NodeView | None = None

    @property
    def free(self) -> int:
        return 0 if self.draining else self.gpus - self.used

    def refresh(self, now: float) -> None:
        if self.draining:
            self.view = draining(self.id, self.used, self.idle_since)
        else:
            rel = tuple(sorted(self.ends.values()))
            ready, until = ready_times(self.gpus - self.used, rel, self.gpus, now)
            self.view = NodeView(self.id, self.gpus, self.idle_since, self.used, rel, ready, until)


@dataclass
class SimPool:
    name: str
    gpu_type: str
    gpus_per_node: int
    market: Market
    rented: bool
    price_per_node_hour: float = 0.0
    on_demand_per_node_hour: float = 0.0
    max_nodes: int | None = None
    launch_latency_s: float = 0.0
    interruption_rate_per_h: float = 0.0
    idle_timeout_s: float = 600.0
    teams: frozenset[str] | None = None
    stockouts_per_day: float = 0.0
    stockout_mean_s: float = 7200.0
    seed: int = 0
    nodes: dict[str, SimNode] = field(default_factory=dict)
    launching: list[tuple[int, int]] = field(default_factory=list)
    closed_until: float = 0.0  # refused a launch: closed to launches until then
    view: PoolView | None = None  # cached while nothing changes
    hist: list[int] = field(default_factory=list)  # nodes by free GPU count
    free_total: int = 0
    # the free indexes of the planning scopes the pool is in, kept current with its nodes
    indexes: list[FreeIndex] = field(default_factory=list)
    _stockout: tuple[float, float] = (0.0, 0.0)  # the current or next stock-out [start, end)
    _rng: random.Random | None = None

    def __post_init__(self) -> None:
        self.hist = [0] * (self.gpus_per_node + 1)

    def add_node(self, node: SimNode, now: float = 0.0) -> None:
        node.refresh(now)
        self.nodes[node.id] = node
        self.hist[node.free] += 1
        self.free_total += node.free
        self.view = None
        for ix in self.indexes:
            ix.add(self.name, node.id, node.free)

    def drop_node(self, node_id: str) -> SimNode | None:
        node = self.nodes.pop(node_id, None)
        if node is not None:
            self.hist[node.free] -= 1
            self.free_total -= node.free
            self.view = None
            for ix in self.indexes:
                ix.drop(node_id)
        return node

    def _change(self, node: SimNode, now: float, used: int | None = None,
                draining: bool | None = None) -> None:
        self.hist[node.free] -= 1
        self.free_total -= node.free
        if used is not None:
            node.used = used
        if draining is not None:
            node.draining = draining
        self.hist[node.free] += 1
        self.free_total += node.free
        for ix in self.indexes:
            ix.set(node.id, node.free)
        node.refresh(now)
        self.view = None

    def use(self, node: SimNode, delta: int, now: float, attempt: int, end: float = math.inf) -> None:
        """An attempt takes (delta > 0, expected to end at `end`) or gives back GPUs on the
        node; keeps the histogram, totals, release times and views current."""
        node.idle_since = now if (node.used + delta == 0 and self.rented) else None
        if delta > 0:
            node.ends[attempt] = (end, delta)
        else:
            node.ends.pop(attempt, None)
        self._change(node, now, used=node.used + delta)

    def expect_end(self, node: SimNode, attempt: int, end: float, now: float) -> None:
        """The attempt on the node now ends at `end` (inf: its GPUs go to another job)."""
        if attempt in node.ends:
            node.ends[attempt] = (end, node.ends[attempt][1])
            node.refresh(now)
            self.view = None

    def drain(self, node: SimNode, now: float) -> None:
        """An interruption notice: the node takes no new work from now on."""
        self._change(node, now, draining=True)

    def fits(self, g: int, n: int) -> bool:
        """At least n nodes with g or more free GPUs."""
        return g <= self.gpus_per_node and sum(self.hist[g:]) >= n

    def stocked_out(self, now: float) -> bool:
        """Whether the pool refuses launches at `now` (seeded stock-out windows)."""
        if self.stockouts_per_day <= 0:
            return False
        if self._rng is None:
            self._rng = random.Random(f"{self.seed}:stockout:{self.name}")
            self._stockout = self._next(0.0)
        while self._stockout[1] <= now:
            self._stockout = self._next(self._stockout[1])
        return self._stockout[0] <= now

    def _next(self, after: float) -> tuple[float, float]:
        assert self._rng is not None
        start = after + self._rng.expovariate(self.stockouts_per_day / 86400.0)
        return start, start + self._rng.expovariate(1.0 / self.stockout_mean_s)

"""The simulator's mutable state: jobs, attempts, nodes and pools (private to broker.sim)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.policy import NodeView, PoolView, RunningView
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
    wait: float = 0.0
    attempts: int = 0
    preemptions: int = 0
    first_start: float | None = None
    done_at: float | None = None
    last_cause: str | None = None  # what ended its previous attempt


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


@dataclass
class SimNode:
    id: str
    gpus: int
    used: int = 0
    idle_since: float | None = None
    launched_at: float = 0.0
    view: NodeView | None = None

    def refresh(self) -> None:
        self.view = NodeView(self.id, self.gpus, self.idle_since, self.used)


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
    nodes: dict[str, SimNode] = field(default_factory=dict)
    launching: list[tuple[int, int]] = field(default_factory=list)
    view: PoolView | None = None  # cached while nothing changes
    hist: list[int] = field(default_factory=list)  # nodes by free GPU count
    free_total: int = 0

    def __post_init__(self) -> None:
        self.hist = [0] * (self.gpus_per_node + 1)

    def add_node(self, node: SimNode) -> None:
        node.refresh()
        self.nodes[node.id] = node
        self.hist[node.gpus - node.used] += 1
        self.free_total += node.gpus - node.used
        self.view = None

    def drop_node(self, node_id: str) -> SimNode | None:
        node = self.nodes.pop(node_id, None)
        if node is not None:
            self.hist[node.gpus - node.used] -= 1
            self.free_total -= node.gpus - node.used
            self.view = None
        return node

    def use(self, node: SimNode, delta: int, now: float) -> None:
        """Change a node's used GPUs; keeps the histogram, totals and views current."""
        self.hist[node.gpus - node.used] -= 1
        node.used += delta
        self.hist[node.gpus - node.used] += 1
        self.free_total -= delta
        node.idle_since = now if (node.used == 0 and self.rented) else None
        node.refresh()
        self.view = None

    def fits(self, g: int, n: int) -> bool:
        """At least n nodes with g or more free GPUs."""
        return g <= self.gpus_per_node and sum(self.hist[g:]) >= n

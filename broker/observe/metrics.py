"""The server's Prometheus metrics: what `GET /metrics` serves.

Two kinds, by where the truth lives:

- **From the database, at scrape time** (`StateCollector`): a handful of GROUP BY queries per
  scrape, so every API process answers the same and nothing is lost when one restarts. The
  counters among them (`..._total`) are sums over rows the broker never rewrites (ended
  attempts, ledger charges), so they only grow and survive restarts; only deleting those rows
  by hand would lower them (Prometheus then sees a counter reset).
- **In this process** (`CYCLE_SECONDS`, `PLAN_SECONDS`, `HTTP_SECONDS`): histograms of work this
  process did. They start empty in a new process; `rate()` and `histogram_quantile()` over
  them handle that. Only the leader observes cycles.

Labels are bounded: teams, pools, GPU types, priority classes, causes, node ids (one per node
of the fleet), route templates (`/v1/jobs/{job_id}`, never a raw path): never a job id or a job
name. Names follow Prometheus's conventions (`onepool_` prefix, base units: seconds, USD,
`_total` for counters).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from broker.checkpoint.telemetry import cause_kind
from broker.clock import Clock
from broker.errors import NotConfigured
from broker.state.model import (
    Attempt,
    AttemptState,
    EndReason,
    Job,
    JobState,
    LedgerEntry,
    Node,
    NodeState,
    Pool,
    Team,
)
from broker.state.model_access import NodeAgent
from broker.state.store import Store
from broker.utilization import IDLE_AFTER_S, IDLE_PCT, held_idle

_CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PLAN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
# registry=None: registered in each app's registry (registry_for), not in a global one.
CYCLE_SECONDS = Histogram("onepool_cycle_duration_seconds", "One scheduling cycle of the leader, "
                          "from reading the state to acting on the plan.", buckets=_CYCLE_BUCKETS,
                          registry=None)
PLAN_SECONDS = Histogram("onepool_plan_duration_seconds", "One call of the pure policy's plan() "
                         "on a snapshot.", buckets=_PLAN_BUCKETS, registry=None)
HTTP_SECONDS = Histogram("onepool_http_request_duration_seconds", "API requests by route template, "
                         "method and status code (long polls of agents included).",
                         ["route", "method", "status"], registry=None)

# A node's GPUs by what they do now (onepool_gpus{state}).
GPU_STATES = ("in_use", "free", "draining", "unavailable", "held_elsewhere")
_DRAINING = (NodeState.DRAINING, NodeState.TERMINATING)
_UNAVAILABLE = (NodeState.LAUNCHING, NodeState.WAITING, NodeState.LOST, NodeState.UNAVAILABLE)
_LIVE = (NodeState.UP, *_DRAINING, *_UNAVAILABLE)
INTERRUPTIONS = (EndReason.INTERRUPTED, EndReason.LOST)


def gpu_type_label(types: Iterable[str]) -> str:
    """A pending job's GPU types as one label value: `any`, or the types sorted, `|`-joined."""
    return "|".join(sorted(types)) or "any"


class StateCollector(Collector):
    """Gauges and counters read from the database at every scrape (see the module's doc)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        with self.store.session() as s:
            yield from _queue(s)
            yield from _capacity(s)
            yield from _utilization(s, now)
            yield from _lost_work(s)
            yield from _spend(s, now)
            yield from _agents(s, now)
            yield from _leader(s, now)


def _queue(s: Session) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("onepool_jobs_pending", "Jobs waiting in the queue.",
                             labels=["priority", "team", "gpu_type"])
    gpus = GaugeMetricFamily("onepool_jobs_pending_gpus", "GPUs the waiting jobs ask for.",
                             labels=["priority", "team", "gpu_type"])
    acc: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    q = select(Job.priority, Job.team, Job.gpu_types, Job.gpus_per_node, Job.nodes).where(
        Job.state == JobState.PENDING)
    for priority, team, types, per_node, nodes in s.exec(q):
        row = acc[(priority, team, gpu_type_label(types))]
        row[0] += 1
        row[1] += per_node * nodes
    for key, (n, g) in sorted(acc.items()):
        jobs.add_metric(list(key), n)
        gpus.add_metric(list(key), g)
    running = GaugeMetricFamily("onepool_jobs_running", "Jobs with a live attempt (every team, 0 "
                                "included).", labels=["team"])
    per_team = dict.fromkeys(s.exec(select(Team.name)).all(), 0)
    per_team.update(s.exec(select(Job.team, func.count()).where(Job.state == JobState.RUNNING)
                           .group_by(Job.team)).all())
    for team, n in sorted(per_team.items()):
        running.add_metric([team], n)
    return iter((jobs, gpus, running))


def _capacity(s: Session) -> Iterator[Metric]:
    """GPUs by pool and state, nodes by pool and state, live attempts by pool and state."""
    attempts = GaugeMetricFamily("onepool_attempts", "Attempts not ended, by pool and state "
                                 "(LAUNCHING, RUNNING, STOPPING).", labels=["pool", "state"])
    used: dict[str, int] = defaultdict(int)
    by_state: dict[tuple[str, str], int] = defaultdict(int)
    for pool, state, alloc in s.exec(select(Attempt.pool, Attempt.state, Attempt.alloc).where(
            Attempt.state != AttemptState.ENDED)):
        by_state[(pool, state)] += 1
        for node, slots in alloc:
            used[node] += len(slots)
    for key, n in sorted(by_state.items()):
        attempts.add_metric(list(key), n)
    pools = {p.name: p for p in s.exec(select(Pool))}
    gpus = GaugeMetricFamily("onepool_gpus", f"GPUs of live nodes by state: {', '.join(GPU_STATES)} "
                             "(held_elsewhere: a Slurm node's GPUs other users hold).",
                             labels=["pool", "gpu_type", "market", "state"])
    nodes = GaugeMetricFamily("onepool_nodes", "Nodes by pool and state (lost: an agent silent too "
                              "long).", labels=["pool", "state"])
    g: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(GPU_STATES, 0))
    n_by: dict[tuple[str, str], int] = defaultdict(int)
    for n in s.exec(select(Node).where(col(Node.state).in_(list(_LIVE)))):
        n_by[(n.pool, n.state)] += 1
        mine = used.get(n.id, 0)
        row = g[n.pool]
        row["in_use"] += mine
        rest = max(0, n.gpus - mine)
        if n.state == NodeState.UP:
            other = min(rest, n.held_elsewhere)
            row["held_elsewhere"] += other
            row["free"] += rest - other
        elif n.state in _DRAINING:
            row["draining"] += rest
        else:
            row["unavailable"] += rest
    for name in sorted(set(g) | {p for p, a in pools.items() if a.active}):
        p = pools.get(name)
        for state, v in g[name].items():
            gpus.add_metric([name, p.gpu_type if p else "", p.market if p else "", state], v)
    for key, v in sorted(n_by.items()):
        nodes.add_metric(list(key), v)
    return iter((attempts, gpus, nodes))


def _utilization(s: Session, now: float) -> Iterator[Metric]:
    """GPU utilization of live attempts that agents sampled, and GPUs held but idle
    (broker.utilization), by team and pool."""
    util = GaugeMetricFamily("onepool_gpu_utilization_ratio", "Mean utilization (0-1) of the GPUs "
                             "live attempts hold, weighted by GPUs; only attempts whose agents "
                             "sample it (NVML).", labels=["team", "pool"])
    idle_gpus = GaugeMetricFamily("onepool_gpus_held_idle", f"GPUs held by attempts below "
                                  f"{IDLE_PCT:g}% for {IDLE_AFTER_S / 60:g} minutes or more.",
                                  labels=["team", "pool"])
    idle_jobs = GaugeMetricFamily("onepool_jobs_held_idle", "Jobs whose live attempt holds its GPUs "
                                  "idle (as onepool_gpus_held_idle).", labels=["team"])
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    jobs: dict[str, int] = defaultdict(int)
    q = (select(Job.team, Attempt).join(Job, Job.id == Attempt.job_id)
         .where(Attempt.state != AttemptState.ENDED, col(Attempt.gpu_util_pct).is_not(None)))
    for team, a in s.exec(q):
        row = acc[(team, a.pool)]
        row[0] += (a.gpu_util_pct or 0.0) / 100.0 * a.gpus
        row[1] += a.gpus
        if held_idle(a, now):
            row[2] += a.gpus
            jobs[team] += 1
    for (team, pool), (busy, gpus, idle) in sorted(acc.items()):
        if gpus:
            util.add_metric([team, pool], busy / gpus)
        idle_gpus.add_metric([team, pool], idle)
    for team, n in sorted(jobs.items()):
        idle_jobs.add_metric([team], n)
    return iter((util, idle_gpus, idle_jobs))


def _lost_work(s: Session) -> Iterator[Metric]:
    """Ended attempts that lost work: preemptions (victim team, preempting team), interruptions
    (cause, victim team, pool) and lost GPU-seconds by cause."""
    pre = CounterMetricFamily("onepool_preemptions", "Attempts preempted, by the victim's team and "
                              "the team whose job preempted it.", labels=["team", "by_team"])
    intr = CounterMetricFamily("onepool_interruptions", "Attempts ended by their node going away: "
                               "cause spot_interruption (a provider's notice) or node_failure "
                               "(lost node), or the cause a notice named.",
                               labels=["cause", "team", "pool"])
    lost = CounterMetricFamily("onepool_lost_gpu_seconds", "GPU-seconds of work lost by ended "
                               "attempts (since their last checkpoint), by end reason, cause (as "
                               "`onepool lost --by cause`), victim team and the team that caused it "
                               "(preemptions; empty otherwise).",
                               labels=["reason", "cause", "team", "by_team"])
    by = aliased(Job)
    q = (select(Attempt.end_reason, Attempt.cause, Attempt.pool, Job.team, by.team,
                func.count(), func.sum(Attempt.lost_gpu_s))
         .join(Job, Job.id == Attempt.job_id).outerjoin(by, by.id == Attempt.preempted_by)
         .where(Attempt.state == AttemptState.ENDED, col(Attempt.cause).is_not(None))
         .group_by(Attempt.end_reason, Attempt.cause, Attempt.pool, Job.team, by.team))
    p: dict[tuple[str, str], float] = defaultdict(float)
    i: dict[tuple[str, str, str], float] = defaultdict(float)
    lo: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for reason, cause, pool, team, by_team, n, gpu_s in s.exec(q):
        kind = cause_kind(cause)
        if reason == EndReason.PREEMPTED:
            p[(team, by_team or "")] += n
        elif reason in INTERRUPTIONS:
            i[(kind, team, pool)] += n
        caused_by = (by_team or "") if reason == EndReason.PREEMPTED else ""
        lo[(str(reason).lower(), kind, team, caused_by)] += gpu_s or 0.0
    for fam, acc in ((pre, p), (intr, i), (lost, lo)):
        for key, v in sorted(acc.items()):
            fam.add_metric(list(key), v)
    return iter((pre, intr, lost))


def _spend(s: Session, now: float) -> Iterator[Metric]:
    """Money charged by the ledger (team, pool, market, kind), and team budgets in their window."""
    spend = CounterMetricFamily("onepool_spend_usd", "USD the ledger charged, by team (empty: "
                                "unused capacity nobody's team pays), pool, market and kind "
                                "(gpu, idle, boot, drain, egress, storage).",
                                labels=["team", "pool", "market", "kind"])
    market = {p.name: p.market for p in s.exec(select(Pool))}
    q = (select(LedgerEntry.team, LedgerEntry.pool, LedgerEntry.kind, func.sum(LedgerEntry.usd))
         .group_by(LedgerEntry.team, LedgerEntry.pool, LedgerEntry.kind))
    for team, pool, kind, usd in sorted(s.exec(q), key=lambda r: (r[0] or "", r[1], r[2])):
        spend.add_metric([team or "", pool, market.get(pool, ""), kind], usd or 0.0)
    yield spend
    budget = GaugeMetricFamily("onepool_team_budget_usd", "A team's budget for its current window "
                               "(teams without one are absent).", labels=["team", "window"])
    spent = GaugeMetricFamily("onepool_team_budget_spent_usd", "What a team spent in its budget's "
                              "current window.", labels=["team", "window"])
    from broker.control.budgets import team_budgets
    from broker.control.config_apply import applied_config

    try:
        cfg = applied_config(s)
    except NotConfigured:
        cfg = None
    for b in team_budgets(s, cfg, now) if cfg is not None else []:
        spent.add_metric([b.team, b.window], b.spent)
        if b.amount is not None:
            budget.add_metric([b.team, b.window], b.amount)
    yield budget
    yield spent


def _agents(s: Session, now: float) -> Iterator[Metric]:
    """Agents that joined and are not lost, and the age of every joined agent's last call."""
    from broker.control.health import settings

    lost_after = settings(s).node_lost_after_s
    connected = GaugeMetricFamily("onepool_agents_connected", "Node agents heard from within "
                                  "node_lost_after_s.")
    age = GaugeMetricFamily("onepool_agent_heartbeat_age_seconds", "Seconds since each joined "
                            "agent's last call (every sync is a heartbeat).", labels=["node", "pool"])
    pool_of = dict(s.exec(select(Node.id, Node.pool).where(col(Node.state).in_(list(_LIVE)))).all())
    n = 0
    q = select(NodeAgent.node, NodeAgent.seen_at, NodeAgent.lost_at).where(
        col(NodeAgent.credential_id).is_not(None)).order_by(NodeAgent.node)
    for node, seen_at, lost_at in s.exec(q):
        if node not in pool_of or seen_at is None:
            continue  # retired or terminated: its agent is gone for good
        a = max(0.0, now - seen_at)
        age.add_metric([node, pool_of[node]], a)
        n += lost_at is None and a <= lost_after
    connected.add_metric([], n)
    return iter((connected, age))


def _leader(s: Session, now: float) -> Iterator[Metric]:
    from broker.control.health import health

    h = health(s, now)
    up = GaugeMetricFamily("onepool_broker_up", "1 when a leader holds the lease and finished a "
                           "cycle recently (as `onepool health`).")
    up.add_metric([], 1.0 if h.broker_up else 0.0)
    held = GaugeMetricFamily("onepool_lease_held", "1 when a broker holds an unexpired leader lease.")
    held.add_metric([], 1.0 if h.leader else 0.0)
    leader = GaugeMetricFamily("onepool_leader", "1 for the broker holding the lease (holder: "
                               "host:pid:...), absent when none does.", labels=["holder"])
    if h.leader:
        leader.add_metric([h.leader], 1.0)
    fencing = GaugeMetricFamily("onepool_lease_fencing", "The lease's fencing number: how many "
                                "times leadership was taken.")
    fencing.add_metric([], h.fencing)
    age = GaugeMetricFamily("onepool_last_cycle_age_seconds", "Seconds since the leader last "
                            "finished a cycle (absent: no cycle ever).")
    if h.last_cycle_age_s is not None:
        age.add_metric([], h.last_cycle_age_s)
    return iter((up, held, leader, fencing, age))


def registry_for(store: Store, clock: Clock) -> CollectorRegistry:
    """A registry with the database's metrics for `store` and this process's histograms."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(store, clock))
    for h in (CYCLE_SECONDS, PLAN_SECONDS, HTTP_SECONDS):
        reg.register(h)
    return reg


def names(reg: CollectorRegistry) -> set[str]:
    """Every series name `reg` exposes, also for families without a sample now: a counter's
    `_total`, a histogram's `_bucket`, `_count` and `_sum`, a gauge's own name."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    return {m.name + sfx for m in reg.collect() for sfx in suffixes.get(m.type, ("",))}


__all__ = ["CYCLE_SECONDS", "HTTP_SECONDS", "PLAN_SECONDS", "StateCollector",
                      "gpu_type_label", "names", "registry_for"]

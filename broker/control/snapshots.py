"""Read the database into the policy's immutable Snapshot."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlmodel import Session, col, or_, select

from broker.control.config_apply import applied_config
from broker.errors import NotConfigured
from broker.policy import (
    NodeView,
    PendingView,
    PolicyConfig,
    PoolView,
    RunningView,
    Snapshot,
    TeamView,
    decayed_gpu_seconds,
)
from broker.policy.estimates import RuntimeHistory
from broker.policy.fairshare import decay
from broker.policy.quota import team_quota
from broker.policy.warm import warm_nodes
from broker.spec import Market, Priority, SpotPolicy
from broker.state.model import Attempt, AttemptState, Job, JobState, Node, NodeState, Pool, Team
from broker.state.model_access import NodeAgent
from providers import start_errors

USAGE_HORIZON_HALF_LIVES = 6  # older usage weighs < 2% and is not read
HISTORY_JOBS = 2000  # the most recent finished jobs that runtime estimates learn from
IDS_PER_QUERY = 5000  # ids per IN (...) list (SQLite allows 32,766 parameters)


class JobLike(Protocol):
    """What the snapshot reads of a job: a Job, or a row of its columns (broker.control.kept)."""

    @property
    def id(self) -> int | None: ...
    @property
    def team(self) -> str: ...
    @property
    def experiment(self) -> str: ...
    @property
    def priority(self) -> str: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def submit_time(self) -> float: ...
    @property
    def gpu_types(self) -> list[Any]: ...
    @property
    def spot(self) -> str: ...
    @property
    def expected_duration_s(self) -> float | None: ...
    @property
    def checkpoint_interval_s(self) -> float: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def deadline_where(self) -> str | None: ...
    @property
    def code_sha256(self) -> str | None: ...
    @property
    def image(self) -> str | None: ...


class AttemptLike(Protocol):
    """What the snapshot reads of an attempt not ended (an Attempt, or a row of its columns)."""

    @property
    def id(self) -> int | None: ...
    @property
    def alloc(self) -> list[Any]: ...
    @property
    def state(self) -> str: ...
    @property
    def started_at(self) -> float: ...
    @property
    def last_checkpoint_at(self) -> float | None: ...
    @property
    def preempted_by(self) -> int | None: ...
    @property
    def stop_reason(self) -> str | None: ...
    @property
    def gpus(self) -> int: ...


@dataclass(frozen=True)
class FairShareUsage:
    """Every team's decayed usage (GPU-seconds, broker.policy.fairshare) as computed at `at`
    from its attempts (`team_usage`)."""

    at: float
    by_team: dict[str, float]


def build_snapshot(s: Session, now: float, config: PolicyConfig, half_life_s: float,
                   usage: FairShareUsage | None = None) -> Snapshot:
    """Everything plan() needs, read in one transaction. Teams' usage: computed now from
    their attempts when `usage` is None; else carried forward from `usage` to `now`
    assuming each team held the GPUs it holds now all along (exact when nothing started or
    ended since `usage.at`; otherwise off by at most the GPU-seconds started or ended since).
    (The leader keeps what it read across cycles instead: broker.control.kept.)"""
    active = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
                    .where(Attempt.state != AttemptState.ENDED)).all()
    history = runtime_history(s)
    failed_on = failed_start_nodes(s)
    held = code_held(s)
    pending = tuple(
        pending_view(j, estimate(history, j), failed_on.get(j.id or 0, frozenset()),
                     warm_nodes(j.code_sha256, held, j.image))
        for j in s.exec(select(Job).where(Job.state == JobState.PENDING,
                                           col(Job.cancel_requested).is_(False))).all()
    )
    return assemble(s, now, config, half_life_s, usage, active, pending, history)


def estimate(history: RuntimeHistory, j: JobLike) -> float | None:
    """A job's runtime estimate: its own, else the one learned for its (team, experiment)."""
    return j.expected_duration_s or history.estimate((j.team, j.experiment))


def assemble(s: Session, now: float, config: PolicyConfig, half_life_s: float,
             usage: FairShareUsage | None, active: Sequence[tuple[AttemptLike, JobLike]],
             pending: tuple[PendingView, ...], history: RuntimeHistory) -> Snapshot:
    """The snapshot from the attempts not ended (with their jobs) and the pending views as
    read (build_snapshot) or kept (broker.control.kept); pools and teams are read here."""
    ours: dict[str, int] = defaultdict(int)  # GPUs onepool's attempts hold per node
    for a, _ in active:
        for node, slots in a.alloc:
            ours[node] += len(slots)
    pools = pool_views(s, ours)
    running = []
    for a, j in active:
        est = estimate(history, j)
        running.append(RunningView(
            attempt_id=a.id, job_id=j.id, team=j.team, priority=Priority(j.priority),
            alloc=tuple((node, len(slots)) for node, slots in a.alloc),
            started_at=a.started_at, submit_time=j.submit_time,
            last_checkpoint_at=a.last_checkpoint_at, times_preempted=j.preemptions,
            stopping=a.state == AttemptState.STOPPING,
            stopping_for=a.preempted_by if a.stop_reason == "preempted" else None,
            checkpoint_period_s=None,
            # a resumed attempt is assumed to redo the whole estimate (its progress is a step
            # count, not seconds): later, never sooner, than the truth
            expected_end=None if est is None else a.started_at + est,
        ))
    if usage is None:
        teams = team_views(s, now, half_life_s)
    else:
        holding: dict[str, int] = defaultdict(int)
        for a, j in active:
            holding[j.team] += a.gpus
        teams = team_views(s, now, half_life_s, {
            t: decay(usage.by_team.get(t, 0.0), holding[t], now - usage.at, half_life_s)
            for t in {*usage.by_team, *holding}})
    return Snapshot(now=now, pools=pools, running=tuple(running), pending=pending,
                    teams=teams, config=config)


def pool_views(s: Session, ours: dict[str, int]) -> tuple[PoolView, ...]:
    """The active pools and their up nodes; `ours`: GPUs onepool's attempts hold per node."""
    nodes: dict[str, list[NodeView]] = defaultdict(list)
    for n in s.exec(select(Node).where(col(Node.state).in_([NodeState.UP, NodeState.UNAVAILABLE]))
                    .order_by(Node.id)).all():
        # Slurm nodes: GPUs other users hold are not onepool's; an unavailable (drained, down)
        # node only carries the work already there.
        held = ours.get(n.id, 0)
        gpus = max(n.gpus - n.held_elsewhere, held) if n.state == NodeState.UP else held
        if gpus or n.state == NodeState.UP:
            nodes[n.pool].append(NodeView(n.id, gpus))
    return tuple(
        PoolView(p.name, p.gpu_type, p.gpus_per_node, tuple(nodes[p.name]), Market(p.market),
                 p.price_per_node_hour / p.gpus_per_node)
        for p in s.exec(select(Pool).where(Pool.active).order_by(Pool.name)).all()
    )


def pending_view(j: JobLike, estimate: float | None = None, failed_on: frozenset[str] = frozenset(),
                 warm_on: frozenset[str] = frozenset()) -> PendingView:
    """The policy's view of a pending job. One with a deadline (broker.control.deadlines) that
    must now run safe may not use spot, whatever its own spot policy; one that keeps pace runs
    on spot or on-prem only (never on demand), unless its own policy is never spot. `warm_on`:
    the nodes that hold its code snapshot (issue 26, broker.policy.warm)."""
    spot = SpotPolicy(j.spot)
    if j.deadline_where in ("safe", "late"):
        spot = SpotPolicy.NEVER
    elif j.deadline_where == "cheap" and spot is not SpotPolicy.NEVER:
        spot = SpotPolicy.ONLY
    return PendingView(j.id or 0, j.team, Priority(j.priority), j.gpus_per_node, j.submit_time,
                       j.nodes, tuple(j.gpu_types), spot, expected_duration_s=estimate,
                       checkpoint_interval_s=j.checkpoint_interval_s, failed_on=failed_on, warm_on=warm_on)


def code_held(s: Session) -> dict[str, frozenset[str]]:
    """Per agent node, the code snapshots and images its agent last reported holding (issue 26)."""
    return {node: frozenset([*(info.get("code_held") or ()), *(info.get("images_held") or ())])
            for node, info in s.exec(select(NodeAgent.node, NodeAgent.info)).all() if isinstance(info, dict)}


def failed_start_nodes(s: Session, job_id: int | None = None,
                       job_ids: Collection[int] | None = None) -> dict[int, frozenset[str]]:
    """Per pending job (or for `job_id`, or the jobs `job_ids`, whatever their state): the
    nodes its attempts failed to start on for a reason that may be the node's
    (providers.start_errors)."""
    if job_ids is not None:
        out: dict[int, frozenset[str]] = {}
        ids = sorted(job_ids)
        for i in range(0, len(ids), IDS_PER_QUERY):
            out.update(_failed_start_nodes(s, col(Attempt.job_id).in_(ids[i:i + IDS_PER_QUERY])))
        return out
    return _failed_start_nodes(s, Job.state == JobState.PENDING if job_id is None
                               else Attempt.job_id == job_id)


def _failed_start_nodes(s: Session, where: Any) -> dict[int, frozenset[str]]:
    q = (select(Attempt.job_id, Attempt.alloc, Attempt.cause).join(Job, Job.id == Attempt.job_id)
         .where(Attempt.state == AttemptState.ENDED,
                col(Attempt.cause).startswith(start_errors.PREFIX + ":")))
    q = q.where(where)
    out: dict[int, set[str]] = defaultdict(set)
    for jid, alloc, cause in s.exec(q).all():
        if not start_errors.job_at_fault(cause):
            out[jid].update(node for node, _ in alloc)
    return {jid: frozenset(nodes) for jid, nodes in out.items()}


def runtime_history(s: Session) -> RuntimeHistory:
    """Runtimes of the most recent succeeded jobs (their attempts' run time summed), per
    (team, experiment), for broker.policy.estimates."""
    recent = select(Job.id).where(Job.state == JobState.SUCCEEDED).order_by(
        col(Job.end_time).desc()).limit(HISTORY_JOBS)
    rows = s.exec(select(Job.id, Job.team, Job.experiment, Attempt.started_at, Attempt.ended_at)
                  .join(Attempt, Attempt.job_id == Job.id)
                  .where(col(Job.id).in_(recent), col(Attempt.ended_at).is_not(None))
                  .order_by(Job.end_time, Job.id)).all()
    per_job: dict[int, tuple[tuple[str, str], float]] = {}
    for jid, team, exp, start, end in rows:
        key, total = per_job.get(jid, ((team, exp), 0.0))
        per_job[jid] = (key, total + max(0.0, end - start))
    history = RuntimeHistory()
    for key, total in per_job.values():
        history.observe(key, total)
    return history


def team_usage(s: Session, now: float, half_life_s: float) -> FairShareUsage:
    """Every team's decayed usage at `now`, from its attempts of the last
    USAGE_HORIZON_HALF_LIVES half lives (the fair-share decay task, and every cycle of an
    engine no schedule drives)."""
    horizon = now - USAGE_HORIZON_HALF_LIVES * half_life_s
    rows = s.exec(select(Job.team, Attempt.started_at, Attempt.ended_at, Attempt.gpus)
                  .join(Job, Job.id == Attempt.job_id)
                  .where(or_(col(Attempt.ended_at).is_(None), col(Attempt.ended_at) > horizon))).all()
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for team, start, end, gpus in rows:
        spans[team].append((start, now if end is None else end, gpus))
    return FairShareUsage(now, {t: decayed_gpu_seconds(sp, now, half_life_s) for t, sp in spans.items()})


def team_views(s: Session, now: float, half_life_s: float,
               usage: dict[str, float] | None = None) -> tuple[TeamView, ...]:
    """The configured teams with their usage: `usage` (team -> decayed GPU-seconds at
    `now`), else computed now (team_usage)."""
    if usage is None:
        usage = team_usage(s, now, half_life_s).by_team
    try:  # quotas (issue 28) are read from the applied config (parsed once per change)
        quotas = {t.name: team_quota(t.quota) for t in applied_config(s).teams}
    except NotConfigured:
        quotas = {}
    return tuple(TeamView(t.name, t.weight, t.priority_allowance_gpus, usage.get(t.name, 0.0),
                          quotas.get(t.name)) for t in s.exec(select(Team).order_by(Team.name)).all())

"""The API's data types: what the SDK returns, the CLI prints and the server sends (JSON-able
pydantic models and plain dataclasses). Imported by the server, the service and the HTTP client
alike, so this module imports nothing of broker.state, broker.control or broker.api at run time
(the `of` builders take database rows, named for the type checker only): `pip install onepool`
on a laptop needs no database layer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from broker.utilization import held_idle
from broker.wire_views import ever_ran

if TYPE_CHECKING:
    from broker.state.model import Attempt, Event, Job

# The cause of an attempt whose rank stopped itself because its node's agent could not reach
# the server for the fence time (providers.local_runner): the outage's loss, no team's, and
# not a node failure. Reported by the agent, recorded on the attempt, grouped by `onepool lost`.
SERVER_UNREACHABLE = "server_unreachable"


def fmt_usd(x: float) -> str:
    """Dollars as a person reads them: cents from $1 up, else enough decimals to show two
    significant digits (so a small estimate is never printed as $0.00), at most six."""
    if x == 0:
        return "$0.00"
    if abs(x) < 5e-7:
        return f"{'-' if x < 0 else ''}<$0.000001"
    places = 2 if abs(x) >= 0.995 else min(6, max(2, 1 - math.floor(math.log10(abs(x)))))
    return f"{'-' if x < 0 else ''}${abs(x):.{places}f}"


class AttemptInfo(BaseModel):
    model_config = ConfigDict(defer_build=True)  # built on first use: a CLI run builds only what it prints
    number: int
    id: int
    pool: str
    alloc: list
    priority: str
    state: str
    started_at: float
    ended_at: float | None
    end_reason: str | None
    exit_code: int | None
    preempted_by: int | None
    restored_step: int | None
    reached_step: int | None
    lost_gpu_s: float
    gpu_s: float
    cause: str | None = None
    checkpoint_uri: str | None = None
    restart_overhead_s: float | None = None
    phases: dict[str, float | bool] | None = None  # restart phases its node timed (broker.phases)
    restore_bytes: int = 0
    egress_bytes: int = 0
    egress_usd: float = 0.0
    progress_step: int | None = None  # the newest step the job reported (broker.runtime.progress)
    progress_total: int | None = None
    progress_at: float | None = None
    progress_rate: float | None = None  # steps per second over this attempt
    # GPU utilization its agents sampled (broker.utilization), percent; None: not sampled.
    gpu_util_pct: float | None = None
    gpu_util_mean_pct: float | None = None
    gpu_idle_since: float | None = None
    held_idle: bool = False  # holds its GPUs below 5% for 10 minutes or more

    @property
    def eta(self) -> float | None:
        """When the job will have done its last step (total - 1) at its rate; None when it did
        not report a total, or has no rate yet."""
        if (self.progress_total is None or self.progress_step is None or self.progress_at is None
                or not self.progress_rate):
            return None
        return self.progress_at + max(0, self.progress_total - 1 - self.progress_step) / self.progress_rate

    @classmethod
    def of(cls, a: Attempt, now: float) -> AttemptInfo:
        end = a.ended_at if a.ended_at is not None else now
        return cls(number=a.number, id=a.id or 0, pool=a.pool, alloc=a.alloc, priority=a.priority,
                   state=a.state, started_at=a.started_at, ended_at=a.ended_at,
                   end_reason=a.end_reason, exit_code=a.exit_code, preempted_by=a.preempted_by,
                   restored_step=a.restored_step, reached_step=a.reached_step,
                   lost_gpu_s=a.lost_gpu_s, gpu_s=max(0.0, end - a.started_at) * a.gpus,
                   cause=a.cause, checkpoint_uri=a.checkpoint_uri,
                   restart_overhead_s=a.restart_overhead_s, phases=a.phases, restore_bytes=a.restore_bytes,
                   egress_bytes=a.egress_bytes, egress_usd=a.egress_usd,
                   progress_step=a.progress_step, progress_total=a.progress_total,
                   progress_at=a.progress_at, progress_rate=a.progress_rate,
                   gpu_util_pct=a.gpu_util_pct, gpu_util_mean_pct=a.gpu_util_mean_pct,
                   gpu_idle_since=a.gpu_idle_since, held_idle=held_idle(a, now))


class CheckpointAdvice(BaseModel):
    """The checkpoint interval the broker advised at the job's last start (issue 31,
    broker.policy.intervals) and, per hour of running, the expected seconds spent saving and
    lost to stops at the interval in force and at the advised one."""

    model_config = ConfigDict(defer_build=True)
    interval_s: float
    save_s: float
    rate_per_h: float
    basis: str
    at: float | None = None
    current_saving_s_per_h: float
    current_lost_s_per_h: float
    advised_saving_s_per_h: float
    advised_lost_s_per_h: float

    @classmethod
    def of(cls, record: dict | None, current_interval_s: float) -> CheckpointAdvice | None:
        from broker.policy.intervals import Advice

        a = Advice.from_record(record)
        if a is None or not current_interval_s > 0:
            return None
        now, adv = a.cost(current_interval_s), a.cost(a.interval_s)
        at = (record or {}).get("at")
        return cls(interval_s=a.interval_s, save_s=a.save_s, rate_per_h=a.rate_per_h, basis=a.basis,
                   at=float(at) if isinstance(at, int | float) else None,
                   current_saving_s_per_h=now.saving_s_per_h, current_lost_s_per_h=now.lost_s_per_h,
                   advised_saving_s_per_h=adv.saving_s_per_h, advised_lost_s_per_h=adv.lost_s_per_h)


class JobInfo(BaseModel):
    model_config = ConfigDict(defer_build=True)  # built on first use: a CLI run builds only what it prints
    id: int
    name: str
    experiment: str
    team: str
    priority: str
    status: str
    gpus_per_node: int
    nodes: int
    gpu_types: list[str]
    budget_usd: float | None
    spot: str
    submit_time: float
    end_time: float | None
    wait_s: float
    attempts: int
    preemptions: int
    last_step: int | None
    checkpoint_uri: str
    waiting_reason: str | None
    gpu_s: float
    lost_gpu_s: float
    resumed_from_step: int | None
    attempt_list: list[AttemptInfo]
    checkpoint_stores: list[str] = []  # distinct store roots its checkpoints lived in
    bytes_restored: int = 0
    egress_bytes: int = 0
    egress_usd: float = 0.0
    caused_lost_gpu_s: float = 0.0  # work other jobs lost because this one preempted them
    # Progress of its newest attempt (broker.runtime.progress): step, total, ETA (epoch s).
    progress_step: int | None = None
    progress_total: int | None = None
    eta: float | None = None
    gpu_util_pct: float | None = None  # its live attempt's newest GPU utilization (percent)
    held_idle: bool = False  # its live attempt holds GPUs idle (broker.utilization)
    # Issue 29: its array (the first element's id) and index; None: not an array element.
    array_id: int | None = None
    array_index: int | None = None
    retries: int = 0  # retries of its own failures allowed (issue 29) ...
    retried: int = 0  # ... and made so far
    after: list[list] = []  # [[job_id, "ok" | "any" | "failed"], ...]: the jobs it waits for
    user: str | None = None  # who submitted it (issue 28; None: a token of the whole team)
    held_by: str | None = None  # on hold (`onepool hold`) by this actor; None: not held
    image: str | None = None  # the OCI image its ranks run in (issue 26); None: on the node
    # Issue 31: the interval in force (auto: the advice at its last start), whether it is
    # advised, and the advice with its expected costs (None: it has not started yet).
    checkpoint_interval_s: float = 1800.0
    checkpoint_auto: bool = False
    checkpoint_advice: CheckpointAdvice | None = None
    # Its deadline (epoch s) and where the deadline rule last said it may run (cheap | safe | late).
    deadline: float | None = None
    deadline_where: str | None = None

    @classmethod
    def of(cls, j: Job, attempts: list[Attempt], now: float, *, stores: list[str] | None = None,
           caused_lost_gpu_s: float = 0.0) -> JobInfo:
        infos = [AttemptInfo.of(a, now) for a in sorted(attempts, key=lambda a: a.number)]
        wait = j.wait_s + (max(0.0, now - j.queued_at) if j.state == "PENDING" else 0.0)
        resumed = next((a.restored_step for a in reversed(infos) if a.restored_step is not None),
                       None)
        last = infos[-1] if infos else None
        running = last is not None and last.ended_at is None
        return cls(id=j.id or 0, name=j.name, experiment=j.experiment, team=j.team,
                   priority=j.priority, status=j.state, gpus_per_node=j.gpus_per_node,
                   nodes=j.nodes, gpu_types=list(j.gpu_types), budget_usd=j.budget_usd,
                   spot=j.spot, submit_time=j.submit_time, end_time=j.end_time, wait_s=wait,
                   attempts=j.attempts, preemptions=j.preemptions, last_step=j.last_step,
                   checkpoint_uri=j.checkpoint_uri, image=j.image,
                   waiting_reason=j.waiting_reason if j.state == "PENDING" else None,
                   gpu_s=sum(a.gpu_s for a in infos), lost_gpu_s=sum(a.lost_gpu_s for a in infos),
                   resumed_from_step=resumed, attempt_list=infos,
                   checkpoint_stores=list(stores or []),
                   bytes_restored=sum(a.restore_bytes for a in infos),
                   egress_bytes=sum(a.egress_bytes for a in infos),
                   egress_usd=sum(a.egress_usd for a in infos), caused_lost_gpu_s=caused_lost_gpu_s,
                   progress_step=last.progress_step if last else None,
                   progress_total=last.progress_total if last else None,
                   eta=last.eta if last is not None and running else None,
                   gpu_util_pct=last.gpu_util_pct if last is not None and running else None,
                   held_idle=last is not None and running and last.held_idle,
                   array_id=j.array_id, array_index=j.array_index, retries=j.retries,
                   retried=j.retried, after=list(j.after or []), user=j.user, held_by=j.held_by,
                   checkpoint_interval_s=j.checkpoint_interval_s, checkpoint_auto=bool(j.checkpoint_auto),
                   checkpoint_advice=CheckpointAdvice.of(j.checkpoint_advice, j.checkpoint_interval_s),
                   deadline=j.deadline, deadline_where=j.deadline_where)


class EventInfo(BaseModel):
    model_config = ConfigDict(defer_build=True)  # built on first use: a CLI run builds only what it prints
    time: float
    job_id: int | None
    attempt_id: int | None
    kind: str
    message: str
    data: dict
    actor: str | None = None  # who made it happen: broker, local:USER, token:ID (team role), agent

    @classmethod
    def of(cls, e: Event) -> EventInfo:
        return cls(time=e.time, job_id=e.job_id, attempt_id=e.attempt_id, kind=e.kind,
                   message=e.message, data=e.data, actor=e.actor)


class LostWorkRow(BaseModel):
    """Lost work under one key (a preempting team or job, or a cause)."""

    model_config = ConfigDict(defer_build=True)  # built on first use: a CLI run builds only what it prints
    key: str
    lost_gpu_s: float
    lost_gpu_hours: float
    attempts: int
    victims: list[int]  # ids of the jobs that lost the work
    restart_gpu_s: float = 0.0  # GPU-s their next attempts spent restarting (broker.phases)


class LogChunk(BaseModel):
    """Output of one rank from byte `offset`; `next_offset` continues it. `attempt_ended` with
    no more data means this attempt's output is complete (the job may have a newer attempt).
    An `offset` past the one asked for means the bytes between were dropped (the cap)."""

    job_id: int
    attempt: int
    attempts: int
    rank: int
    offset: int  # where `data` starts: the offset asked for, or the next byte kept after it
    next_offset: int
    data: str
    attempt_ended: bool
    job_status: str
    # bytes of this rank's output the server no longer has (over broker.output_cap_bytes:
    # the tail is kept); bytes dropped between the offset asked for and `offset` are part of it
    dropped: int = 0




class TokenInfo(BaseModel):
    """An API token without its secret (`token` is set only in the answer that created it)."""

    id: str
    team: str
    role: str
    note: str
    user: str | None = None  # the person it belongs to (None: the whole team)
    created_at: float
    created_by: str
    revoked_at: float | None
    token: str | None = None


class JoinTokenInfo(BaseModel):
    node: str
    pool: str
    join_token: str
    expires_at: float


class NodeInfo(BaseModel):
    """One node now: its state, GPUs, how many are free, who holds the rest, since when."""

    model_config = ConfigDict(defer_build=True)  # built on first use: a CLI run builds only what it prints
    id: str
    pool: str
    state: str
    gpus: int
    free_gpus: int
    jobs: list[int]  # jobs holding GPUs here
    since: float | None  # rented: its launch request; config nodes: first metered
    age_s: float | None
    instance_id: str | None = None
    zone: str | None = None
    gpu_type: str = ""
    market: str = ""
    executor: str = "local"  # local (the broker machine's slots) | agent | slurm
    agent_seen_s_ago: float | None = None  # agent-served nodes: since its last call
    agent: dict = {}  # what its agent reported when it joined (hostname, pid, GPUs, ...)


class PoolInfo(BaseModel):
    """One pool now: its offer (market, price in force) and its nodes. `usd_per_gpu_hour` is
    what a GPU-hour is charged (on-prem: amortized; free for placement); None with `unpriced`
    saying why when a rented pool has no price."""

    model_config = ConfigDict(defer_build=True)  # built on first use: a CLI run builds only what it prints
    name: str
    provider: str
    market: str
    gpu_type: str
    gpus_per_node: int
    region: str
    active: bool
    max_nodes: int | None
    usd_per_node_hour: float | None
    usd_per_gpu_hour: float | None
    unpriced: str | None = None
    nodes: list[NodeInfo]

    @property
    def free_gpus(self) -> int:
        return sum(n.free_gpus for n in self.nodes)

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.state in ("up", "draining"))


class MoveInfo(BaseModel):
    """A move rebalancing would start now (broker.policy.rebalance.Move.as_dict): the running
    `attempt` of `job` from `from_pool` to `to_pool` (after launching `launch_nodes` nodes
    there), saving and costing USD over its expected remaining run time."""

    job: int
    attempt: int
    from_pool: str
    to_pool: str
    saving_usd: float
    cost_usd: float
    reason: str
    launch_nodes: int


class ServerInfo(BaseModel):
    """One API server a client was given (ONEPOOL_URL=URL1,URL2): does it answer, and is its
    process the leader's (`onepool server` runs the API and a broker: the one holding the lease
    leads, the others stand by) or a standby."""

    url: str
    role: str  # leader | standby | down
    served_by: str | None = None  # host:pid of the process that answered
    error: str | None = None  # why it did not answer


class Health(BaseModel):
    broker_up: bool
    leader: str | None  # holder id (host:pid:...) of the lease, None when free
    fencing: int  # the lease's fencing number (how many times leadership changed hands)
    lease_expires_at: float | None
    last_cycle_at: float | None
    last_cycle_age_s: float | None
    stale_after_s: float
    down_since: float | None  # when not up: the last sign of life (None: never ran)
    summary: str  # one human line
    served_by: str | None = None  # host:pid of the API process that answered (over HTTP)
    servers: list[ServerInfo] = []  # over HTTP with several URLs: each one's answer

    def role_of(self, served_by: str | None) -> str:
        """`leader` when the process `served_by` (host:pid) holds the lease, else `standby`."""
        return "leader" if served_by and (self.leader or "").startswith(served_by + ":") else "standby"

    @property
    def ever_ran(self) -> bool:
        return ever_ran(self.last_cycle_at, self.fencing)


class CostRow(BaseModel):
    """Money under one key. `jobs` counts distinct jobs charged or losing work there."""

    key: str
    usd: float
    gpu_hours: float
    lost_gpu_hours: float
    jobs: int
    lost_usd: float = 0.0
    idle_usd: float = 0.0


@dataclass(frozen=True)
class TeamBudget:
    """A team's windowed budget now. state: none | ok | low | exhausted."""

    team: str
    amount: float | None
    window: str
    window_start: float
    window_end: float | None
    spent: float
    state: str
    low_fraction: float

    @property
    def remaining(self) -> float | None:
        return None if self.amount is None else self.amount - self.spent

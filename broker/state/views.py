"""Read views returned by the SDK and printed by the CLI (JSON-able pydantic models)."""

from __future__ import annotations

from pydantic import BaseModel

from broker.state.model import Attempt, Event, Job


class AttemptInfo(BaseModel):
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
    restore_bytes: int = 0
    egress_bytes: int = 0
    egress_usd: float = 0.0

    @classmethod
    def of(cls, a: Attempt, now: float) -> AttemptInfo:
        end = a.ended_at if a.ended_at is not None else now
        return cls(number=a.number, id=a.id or 0, pool=a.pool, alloc=a.alloc, priority=a.priority,
                   state=a.state, started_at=a.started_at, ended_at=a.ended_at,
                   end_reason=a.end_reason, exit_code=a.exit_code, preempted_by=a.preempted_by,
                   restored_step=a.restored_step, reached_step=a.reached_step,
                   lost_gpu_s=a.lost_gpu_s, gpu_s=max(0.0, end - a.started_at) * a.gpus,
                   cause=a.cause, checkpoint_uri=a.checkpoint_uri,
                   restart_overhead_s=a.restart_overhead_s, restore_bytes=a.restore_bytes,
                   egress_bytes=a.egress_bytes, egress_usd=a.egress_usd)


class JobInfo(BaseModel):
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

    @classmethod
    def of(cls, j: Job, attempts: list[Attempt], now: float, *, stores: list[str] | None = None,
           caused_lost_gpu_s: float = 0.0) -> JobInfo:
        infos = [AttemptInfo.of(a, now) for a in sorted(attempts, key=lambda a: a.number)]
        wait = j.wait_s + (max(0.0, now - j.queued_at) if j.state == "PENDING" else 0.0)
        resumed = next((a.restored_step for a in reversed(infos) if a.restored_step is not None),
                       None)
        return cls(id=j.id or 0, name=j.name, experiment=j.experiment, team=j.team,
                   priority=j.priority, status=j.state, gpus_per_node=j.gpus_per_node,
                   nodes=j.nodes, gpu_types=list(j.gpu_types), budget_usd=j.budget_usd,
                   spot=j.spot, submit_time=j.submit_time, end_time=j.end_time, wait_s=wait,
                   attempts=j.attempts, preemptions=j.preemptions, last_step=j.last_step,
                   checkpoint_uri=j.checkpoint_uri, waiting_reason=j.waiting_reason,
                   gpu_s=sum(a.gpu_s for a in infos), lost_gpu_s=sum(a.lost_gpu_s for a in infos),
                   resumed_from_step=resumed, attempt_list=infos,
                   checkpoint_stores=list(stores or []),
                   bytes_restored=sum(a.restore_bytes for a in infos),
                   egress_bytes=sum(a.egress_bytes for a in infos),
                   egress_usd=sum(a.egress_usd for a in infos), caused_lost_gpu_s=caused_lost_gpu_s)


class EventInfo(BaseModel):
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

    key: str
    lost_gpu_s: float
    lost_gpu_hours: float
    attempts: int
    victims: list[int]  # ids of the jobs that lost the work


class LogChunk(BaseModel):
    """Output of one rank from byte `offset`; `next_offset` continues it. `attempt_ended` with
    no more data means this attempt's output is complete (the job may have a newer attempt)."""

    job_id: int
    attempt: int
    attempts: int
    rank: int
    offset: int
    next_offset: int
    data: str
    attempt_ended: bool
    job_status: str


class NodeInfo(BaseModel):
    """A node as users see it: where it is, how many GPUs are free, who serves it."""

    id: str
    pool: str
    gpu_type: str
    market: str
    state: str
    gpus: int
    free_gpus: int
    executor: str  # local (this machine's slots) | agent
    agent_seen_s_ago: float | None = None
    agent: dict = {}


class TokenInfo(BaseModel):
    """An API token without its secret (`token` is set only in the answer that created it)."""

    id: str
    team: str
    role: str
    note: str
    created_at: float
    created_by: str
    revoked_at: float | None
    token: str | None = None


class JoinTokenInfo(BaseModel):
    node: str
    pool: str
    join_token: str
    expires_at: float

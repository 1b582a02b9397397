"""Read views returned by the SDK and printed by the CLI (JSON-able pydantic models)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from broker.state.model import Attempt, Event, Job


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

    @classmethod
    def of(cls, e: Event) -> EventInfo:
        return cls(time=e.time, job_id=e.job_id, attempt_id=e.attempt_id, kind=e.kind,
                   message=e.message, data=e.data)


class LostWorkRow(BaseModel):
    """Lost work under one key (a preempting team or job, or a cause)."""

    key: str
    lost_gpu_s: float
    lost_gpu_hours: float
    attempts: int
    victims: list[int]  # ids of the jobs that lost the work

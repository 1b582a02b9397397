"""SQLModel tables: the broker's persistent state. Times are float seconds on the broker's clock.

Object storage is the truth for checkpoints; the Checkpoint table is the broker's index of
what it has seen committed there.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Column, Index
from sqlmodel import Field, SQLModel


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # Its budget is spent: it took a final checkpoint and stopped. Not final: raising the
    # budget (`onepool budget set JOB AMOUNT`) puts it back in the queue (issue 6).
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"

    @property
    def final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class AttemptState(StrEnum):
    LAUNCHING = "LAUNCHING"  # row written, processes may or may not have started
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # signalled; killed after the grace period
    ENDED = "ENDED"


class EndReason(StrEnum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"  # the processes vanished without an exit status (node failure, reboot)
    INTERRUPTED = "INTERRUPTED"  # the provider reclaimed the node after a notice (spot)
    BUDGET = "BUDGET"  # stopped because the job's or its team's budget is spent (issue 6)


def _json(default: Any = None) -> Any:
    return Field(default_factory=lambda: default() if callable(default) else default,
                 sa_column=Column(JSON, nullable=False))


class Setting(SQLModel, table=True):
    key: str = Field(primary_key=True, max_length=64)
    value: dict = _json(dict)


class Team(SQLModel, table=True):
    name: str = Field(primary_key=True, max_length=63)
    weight: float = 1.0
    priority_allowance_gpus: int = 8


class Pool(SQLModel, table=True):
    name: str = Field(primary_key=True, max_length=63)
    provider: str = Field(max_length=32)
    gpu_type: str = Field(max_length=40)
    gpus_per_node: int
    nodes: int
    region: str = Field(default="local", max_length=64)
    market: str = Field(default="onprem", max_length=16)
    price_per_node_hour: float = 0.0
    store: str | None = None
    active: bool = True


class NodeState(StrEnum):
    LAUNCHING = "launching"  # row (and its token) written; the instance may or may not exist yet
    UP = "up"
    DRAINING = "draining"  # an interruption notice came: nothing new lands, it goes when empty
    TERMINATING = "terminating"  # decided; the provider call may or may not have happened
    TERMINATED = "terminated"
    RETIRED = "retired"  # a static node dropped from the config
    WAITING = "waiting"  # an agent-served on-prem node whose agent has not joined yet
    LOST = "lost"  # an agent-served on-prem node whose agent stopped calling in (it may return)
    # A Slurm node that is drained, down, not responding or out of the partition (it may
    # return): nothing new lands; work already there runs on and is still charged.
    UNAVAILABLE = "unavailable"


class Node(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=128)
    pool: str = Field(foreign_key="pool.name", index=True, max_length=63)
    gpus: int
    state: str = Field(default="up", max_length=16, index=True)  # see NodeState
    # Rented nodes only (broker.control.capacity_manager):
    token: str | None = Field(default=None, max_length=64)  # the idempotency token, set before launch
    instance_id: str | None = Field(default=None, max_length=128)
    for_job_id: int | None = None  # the job it was launched for
    zone: str | None = Field(default=None, max_length=64)
    launched_at: float | None = None
    ready_at: float | None = None
    idle_since: float | None = None
    ended_at: float | None = None
    end_reason: str | None = Field(default=None, max_length=32)
    # Slurm nodes only: GPUs that others hold (other users' jobs): not free to onepool.
    held_elsewhere: int = 0


class Job(SQLModel, table=True):
    __table_args__ = (Index("ix_job_state_submit", "state", "submit_time"),)
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=63)
    experiment: str = Field(default="default", max_length=63, index=True)
    team: str = Field(foreign_key="team.name", index=True, max_length=63)
    command: list = _json(list)
    env: dict = _json(dict)
    workdir: str | None = None
    gpus_per_node: int = 1
    nodes: int = 1
    gpu_types: list = _json(list)
    priority: str = Field(default="normal", max_length=16)
    budget_usd: float | None = None
    spot: str = Field(default="allowed", max_length=16)
    checkpoint_interval_s: float = 1800.0
    expected_duration_s: float | None = None
    state: str = Field(default=JobState.PENDING, max_length=16)
    submit_time: float
    queued_at: float  # when it last became PENDING (wait accounting)
    end_time: float | None = None
    wait_s: float = 0.0  # total time spent PENDING before its attempts started
    cancel_requested: bool = False
    attempts: int = 0
    preemptions: int = 0
    checkpoint_uri: str = ""
    last_step: int | None = None  # newest committed checkpoint step seen
    last_checkpoint_at: float | None = None
    waiting_reason: str | None = None
    submitted_by: str | None = Field(default=None, max_length=120)  # who submitted it (issue 9)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


class Attempt(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    number: int
    pool: str = Field(foreign_key="pool.name", max_length=63)
    alloc: list = _json(list)  # [[node_id, [slot, ...]], ...], one entry per rank
    priority: str = Field(max_length=16)  # effective class when placed
    state: str = Field(default=AttemptState.LAUNCHING, max_length=16, index=True)
    started_at: float
    ended_at: float | None = None
    end_reason: str | None = Field(default=None, max_length=16)
    exit_code: int | None = None
    stop_requested_at: float | None = None
    stop_reason: str | None = Field(default=None, max_length=16)  # preempted | cancelled
    preempted_by: int | None = None
    handles: list = _json(list)  # provider handles, one per rank
    restored_step: int | None = None
    reached_step: int | None = None
    last_checkpoint_at: float | None = None
    lost_gpu_s: float = 0.0
    gpus: int = 0
    # Checkpoint telemetry (see broker.checkpoint.telemetry).
    checkpoint_uri: str | None = None  # the job prefix this attempt writes to (its pool's store)
    cause: str | None = Field(default=None, max_length=64)  # why it ended, if not completed
    restore_bytes: int = 0  # size of the checkpoint it resumed from
    egress_bytes: int = 0  # bytes copied from another store before it started
    egress_usd: float = 0.0
    first_step_at: float | None = None  # when the broker first saw it make new progress
    restart_overhead_s: float | None = None  # first_step_at - started_at


class CheckpointState(StrEnum):
    COMMITTED = "committed"
    PARTIAL = "partial"  # a step folder without a manifest (so far)
    DAMAGED = "damaged"  # committed, but its files failed verification
    DELETED = "deleted"  # removed by retention (it did exist, committed)
    ABANDONED = "abandoned"  # a partial folder removed by retention


class Checkpoint(SQLModel, table=True):
    """One step folder of a job in one store (a copy in another store is another row)."""

    __table_args__ = (Index("ix_checkpoint_job_store_step", "job_id", "store", "step", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    step: int
    attempt_id: int | None = None
    uri: str
    observed_at: float
    written_at: float | None = None
    bytes: int = 0
    store: str = ""  # the store root URI
    state: str = Field(default=CheckpointState.COMMITTED, max_length=16, index=True)
    copied_from: str | None = None  # the step folder URI it was copied from
    deleted_at: float | None = None


class Event(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    time: float = Field(index=True)
    job_id: int | None = Field(default=None, index=True)
    attempt_id: int | None = None
    kind: str = Field(max_length=32)
    message: str = ""
    data: dict = _json(dict)
    actor: str | None = Field(default=None, max_length=120)  # who made the change (issue 9)


# -- money (issue 6): see broker/state/ledger.py -------------------------------------------------
class NodeMeter(SQLModel, table=True):
    """One node's time on the meter: from `started_at` (on-prem: first seen; rented: launch)
    to `ended_at` (retired or terminated; None while up). `metered_to` is how far the ledger
    has charged it. `launched_for_team` is the team whose job triggered a rented launch."""

    id: int | None = Field(default=None, primary_key=True)
    node: str = Field(max_length=128, index=True)
    pool: str = Field(max_length=63)
    gpus: int
    started_at: float
    metered_to: float
    ended_at: float | None = None
    launched_for_team: str | None = Field(default=None, max_length=63)


class PriceChange(SQLModel, table=True):
    """The price of a pool's node-hour from `at` on (spot price moves, re-priced offers)."""

    id: int | None = Field(default=None, primary_key=True)
    pool: str = Field(max_length=63, index=True)
    at: float
    usd_per_node_hour: float


class LedgerEntry(SQLModel, table=True):
    """Money spent: `usd` for `gpus` GPUs of `node` over [start, end] at `usd_per_gpu_hour`.

    kind: "gpu" (a job's share of a node: job_id/attempt_id set), "idle" (GPUs nobody used:
    charged to the pool, or to `team` when idle rented time goes to the launching team),
    "egress" (checkpoint bytes copied across stores for an attempt; start == end)."""

    __table_args__ = (Index("ix_ledger_node_attempt_kind", "node", "attempt_id", "kind", "end"),)
    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=8)
    pool: str = Field(max_length=63, index=True)
    node: str = Field(default="", max_length=128)
    job_id: int | None = Field(default=None, index=True)
    attempt_id: int | None = None
    team: str | None = Field(default=None, max_length=63, index=True)
    experiment: str | None = Field(default=None, max_length=63)
    start: float = Field(index=True)
    end: float
    gpus: int = 0
    usd_per_gpu_hour: float = 0.0
    usd: float = 0.0

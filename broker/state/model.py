"""SQLModel tables: the broker's persistent state. Times are float seconds on the broker's clock.

Object storage is the truth for checkpoints; the Checkpoint table is the broker's index of
what it has seen committed there.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, LargeBinary
from sqlmodel import Field, SQLModel

from broker.state.states import AttemptState, CheckpointState, EndReason, JobState, NodeState

__all__ = ["Attempt", "AttemptState", "ChangeCounter", "Checkpoint", "CheckpointState", "EndReason",
           "Event", "Job", "JobState", "LedgerEntry", "Node", "NodeMeter", "NodeState", "Pool", "PriceChange",
           "SchedulerJob", "Setting", "Team", "WebhookDelivery"]


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


class Node(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=128)
    pool: str = Field(foreign_key="pool.name", index=True, max_length=63)
    gpus: int
    state: str = Field(default="up", max_length=16, index=True)  # see NodeState
    # Rented nodes only (broker.control.capacity_manager):
    token: str | None = Field(default=None, max_length=64)  # the idempotency token, set before launch
    instance_id: str | None = Field(default=None, max_length=300)  # Azure ids are resource paths
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
    image: str | None = Field(default=None, max_length=512)  # OCI reference (issue 26)
    gpus_per_node: int = 1
    nodes: int = 1
    gpu_types: list = _json(list)
    priority: str = Field(default="normal", max_length=16)
    budget_usd: float | None = None
    spot: str = Field(default="allowed", max_length=16)
    checkpoint_interval_s: float = 1800.0  # in force; auto: the advice at its last start
    checkpoint_auto: bool = False  # `checkpoint_interval_s: auto` (broker.control.intervals)
    # the advice at its last start (broker.policy.intervals.Advice.to_record; None: not started yet)
    checkpoint_advice: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    expected_duration_s: float | None = None
    # Issue 31 (broker.policy.deadlines): finish by then (epoch s), and where the rule last
    # said it may run: cheap | safe | late (None: not decided yet, or no deadline).
    deadline: float | None = None
    deadline_where: str | None = Field(default=None, max_length=8)
    state: str = Field(default=JobState.PENDING, max_length=16)
    submit_time: float
    queued_at: float  # when it last became PENDING (wait accounting)
    end_time: float | None = None
    wait_s: float = 0.0  # total time spent PENDING before its attempts started
    cancel_requested: bool = Field(default=False, index=True)  # few are: the cycle looks them up
    attempts: int = 0
    preemptions: int = 0
    checkpoint_uri: str = ""
    last_step: int | None = None  # newest committed checkpoint step seen
    last_checkpoint_at: float | None = None
    waiting_reason: str | None = None
    submitted_by: str | None = Field(default=None, max_length=120)  # who submitted it (issue 9)
    # The person who submitted it (issue 28): the token's user, the local user embedded; None
    # for a token without a user (it acts as its whole team).
    user: str | None = Field(default=None, max_length=63, index=True)
    held_by: str | None = Field(default=None, max_length=120)  # on hold (`onepool hold`): by whom
    # Its own webhook (issue 30, broker.control.notify): secrets, never in a view or a log.
    webhook_url: str | None = Field(default=None, max_length=2000)
    webhook_secret: str | None = Field(default=None, max_length=200)
    # Arrays, dependencies, retries (issue 29): its array (the id of the array's first
    # element), index and limit of elements running at once; the jobs it waits for, as
    # [[job_id, "ok" | "any" | "failed"], ...]; retries of its own failures allowed and made,
    # the exit codes never retried, and the earliest time its next try may start.
    array_id: int | None = Field(default=None, index=True)
    array_index: int | None = None
    array_limit: int | None = None
    after: list = _json(list)
    retries: int = 0
    retried: int = 0
    retry_backoff_s: float = 30.0
    no_retry_exit_codes: list = _json(list)
    not_before: float | None = None
    # Its code snapshot (issue 26, broker.spec_code): the sha256 its ranks verify and where
    # nodes fetch it (None: no snapshot; the job runs in `workdir` or its rank folder).
    code_sha256: str | None = Field(default=None, max_length=64)
    code_uri: str | None = Field(default=None, max_length=4200)
    setup: list = _json(list)  # its setup commands (providers.setup_runner)
    data: dict = _json(dict)  # path -> URI, linked read-only (providers.data_cache)
    # The change counter's value at its last write, set by a database trigger on every insert
    # and update (migration 0023, broker.control.kept): the leader reads only the rows whose
    # number passed the one it saw last. Never written by the application.
    change_seq: int = Field(default=0, sa_type=BigInteger, index=True)

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
    restore_bytes: int = Field(default=0, sa_type=BigInteger)  # size of the checkpoint it resumed from
    egress_bytes: int = Field(default=0, sa_type=BigInteger)  # bytes copied from another store first
    egress_usd: float = 0.0
    first_step_at: float | None = None  # when the broker first saw it make new progress
    # Restart phases its first rank's node timed (broker.phases; None: not read yet).
    phases: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    restart_overhead_s: float | None = None  # first_step_at - started_at
    # Progress the job reports (broker.runtime.progress(step, total=...), issue 13): its newest
    # step, the total it announced (None: unknown), when it reported it (the job's clock), its
    # steps per second over this attempt, and when the broker last read the report.
    progress_step: int | None = None
    progress_total: int | None = None
    progress_at: float | None = None
    progress_rate: float | None = None
    progress_read_at: float | None = None
    # GPU utilization its agents sampled (issue 30, broker.control.agents): the newest mean over
    # its ranks (percent), the time-weighted mean over the seconds it was sampled, when it was
    # last sampled, and since when it has been below the idle threshold (None: it is not).
    gpu_util_pct: float | None = None
    gpu_util_mean_pct: float | None = None
    gpu_util_s: float = 0.0
    gpu_util_at: float | None = None
    gpu_idle_since: float | None = None
    change_seq: int = Field(default=0, sa_type=BigInteger, index=True)  # as Job.change_seq


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
    bytes: int = Field(default=0, sa_type=BigInteger)  # checkpoints pass 2 GiB
    store: str = ""  # the store root URI
    state: str = Field(default=CheckpointState.COMMITTED, max_length=16, index=True)
    copied_from: str | None = None  # the step folder URI it was copied from
    save_s: float | None = None  # the save's duration its writer measured (manifest save_s)
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
    """One node's time on the meter: from `started_at` (on-prem: first seen; rented: the launch
    request) to `ended_at` (retired, or the confirmed termination; None while metered).
    `metered_to` is how far the ledger has charged it. `launched_for_team` is the team whose
    job triggered a rented launch. A rented node boots until `ready_at` and drains from
    `drain_at` (an interruption notice or the decision to give it back) to its end."""

    id: int | None = Field(default=None, primary_key=True)
    node: str = Field(max_length=128, index=True)
    pool: str = Field(max_length=63)
    gpus: int
    started_at: float
    metered_to: float
    ended_at: float | None = None
    launched_for_team: str | None = Field(default=None, max_length=63)
    rented: bool = False  # metered by the capacity manager's hooks, not by accrue()
    ready_at: float | None = None
    drain_at: float | None = None


class PriceChange(SQLModel, table=True):
    """The price of a pool's node-hour from `at` on (spot price moves, re-priced offers)."""

    id: int | None = Field(default=None, primary_key=True)
    pool: str = Field(max_length=63, index=True)
    at: float
    usd_per_node_hour: float


class LedgerEntry(SQLModel, table=True):
    """Money spent: `usd` for `gpus` GPUs of `node` over [start, end] at `usd_per_gpu_hour`.

    kind: "gpu" (a job's share of a node: job_id/attempt_id set); GPUs nobody used, charged to
    the pool (or to `team` when rented time goes to the launching team): "boot" (a rented node
    from its launch request to ready), "idle" (up, unused), "drain" (from an interruption
    notice or the decision to give it back, to the confirmed termination); "egress"
    (checkpoint bytes copied across stores for an attempt; start == end); "storage" (one
    checkpoint's `gb` GiB kept in object storage over [start, end]; `checkpoint_id` set, and
    `usd_per_gpu_hour` holds the USD per GiB-hour)."""

    # ix_ledger_spend covers GET /metrics' spend by team, pool and kind (an index-only scan).
    __table_args__ = (Index("ix_ledger_node_attempt_kind", "node", "attempt_id", "kind", "end"),
                      Index("ix_ledger_spend", "team", "pool", "kind", "usd"))
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
    checkpoint_id: int | None = Field(default=None, index=True)
    gb: float = 0.0


# -- one leader, recorded notices (issue 10): see broker/control/lease.py, capacity_manager.py ----
class ChangeCounter(SQLModel, table=True):
    """One row ("rows"): the number the triggers of migration 0023 give each job and attempt
    row they write (its `change_seq`). On PostgreSQL the trigger's UPDATE of this row holds
    its lock until the writer commits, so numbers become visible in the order they were
    given (broker.control.kept relies on it)."""

    name: str = Field(primary_key=True, max_length=32)
    n: int = Field(default=0, sa_type=BigInteger)


class Lease(SQLModel, table=True):
    """The leader lease: one row per lease name ("broker"). `fencing` grows by one with every
    new holder; a write of the leader's commits only while the row still holds its number.
    `cycled_at` is when the holder last finished a cycle (health)."""

    name: str = Field(primary_key=True, max_length=32)
    holder: str | None = Field(default=None, max_length=200)
    fencing: int = 0
    acquired_at: float | None = None
    renewed_at: float | None = None
    expires_at: float = 0.0
    cycled_at: float | None = None


class Notice(SQLModel, table=True):
    """An interruption notice, recorded BEFORE it is acknowledged to (deleted from) the
    provider's queue, and acted on once (`handled_at`). `key` identifies the notice at its
    source (a queue message id, an operation name), so a redelivery is recorded once."""

    __table_args__ = (Index("ix_notice_key", "key", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=255)
    pool: str = Field(max_length=63)
    instance_id: str = Field(max_length=128)
    kind: str = Field(max_length=32)
    deadline: float | None = None
    received_at: float
    handled_at: float | None = Field(default=None, index=True)


# -- providers (issue 15): see broker/state/notices.py ----------------------------------------
class ProviderNotice(SQLModel, table=True):
    """A notice a provider read from its cloud's API (GCP `compute.instances.preempted`
    operations), recorded once per pool: the provider stops reading at the first notice it
    finds here, so none is reported twice, also after a restart."""

    __table_args__ = (Index("ix_providernotice_pool_key", "pool", "key", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    pool: str = Field(max_length=63)
    key: str = Field(max_length=200)  # the notice's own id (the operation's name)
    instance_id: str = Field(max_length=200)
    kind: str = Field(max_length=32)  # preempted | ...
    scope: str = Field(default="", max_length=64)  # the zone it was read in
    seen_at: float


# -- the leader's periodic tasks (issue 12): see broker/control/scheduled.py -------------------
class SchedulerJob(SQLModel, table=True):
    """APScheduler's job store (SQLAlchemyJobStore): one row per periodic task, its pickled
    schedule and next run time (UTC epoch seconds). Written only by APScheduler; declared here
    so the migrations own the schema."""

    __tablename__ = "apscheduler_jobs"
    id: str = Field(primary_key=True, max_length=191)
    next_run_time: float | None = Field(default=None, index=True)
    job_state: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


# -- notifications (issue 30): see broker/control/notify.py -------------------------------------
class WebhookDelivery(SQLModel, table=True):
    """One notification to one webhook (`target`: a team's or a job's): made once from event
    `event_id` (unique per target), sent until a 2xx answers it (`delivered_at`), `attempts`
    times so far, next at `next_at`. `last_error` says why the last try failed, never the URL."""

    __table_args__ = (Index("ix_webhookdelivery_target_event", "target", "event_id", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    target: str = Field(max_length=80)  # team:NAME or job:ID, whose webhook it goes to
    team: str = Field(max_length=63)
    event_id: int
    kind: str = Field(max_length=32)
    payload: dict = _json(dict)
    created_at: float
    attempts: int = 0
    next_at: float = Field(index=True)
    delivered_at: float | None = Field(default=None, index=True)
    last_error: str | None = Field(default=None, max_length=200)


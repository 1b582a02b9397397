"""The contract between the broker and where work runs.

Errors say what the caller should do next:
- NoCapacity: this pool cannot take it now; try another pool.
- Transient: a blip (throttling, timeout, 5xx); retry the same call later with backoff.
- Fatal: retrying cannot help (bad credentials, bad request); give up and report.

An Executor runs the processes of one attempt, one per rank (node). Its contract:
- start() is idempotent per (attempt_id, rank): a second call returns the first process's
  handle instead of starting another, also after a broker crash (recover=True searches for
  a process started by a crashed broker before starting one). It raises StartFailed when
  the rank cannot start for a reason of its own (the attempt fails, the broker goes on).
- status() tells RUNNING, EXITED (with the exit code) or LOST (gone without an exit code),
  and ORPHANED while processes of a rank whose supervisor died still live. EXITED and LOST
  promise that no process of the rank is alive. A `cause` says when the platform, not the
  job, ended it (e.g. slurm_preempted, node_failure): the engine then requeues the attempt
  as interrupted (lost for node_failure).
- signal() of a process that is gone returns quietly; SIGKILL kills every process of the
  rank, wherever it went (its containment).
- `node` names the node the rank was placed on (executors that run ranks elsewhere use it).

A Provider rents capacity (nodes) for rented pools; see `Provider` for its contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class ProviderError(Exception):
    """Base of provider errors."""


class NoCapacity(ProviderError):
    """The pool has no capacity for this now: try another pool."""


class Transient(ProviderError):
    """A temporary failure: retry later, with backoff."""


class Fatal(ProviderError):
    """Retrying cannot help: give up and report it."""


class StartFailed(ProviderError):
    """A rank could not be started for a reason of its own (a working directory that does
    not exist, a NUL byte in its command): that attempt fails; the broker goes on. `cause`
    names why, as providers.start_errors does (`start_failed:<kind>`)."""

    def __init__(self, message: str, cause: str = "start_failed") -> None:
        super().__init__(message)
        self.cause = cause


class RankState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"
    # Its supervisor is gone but processes of the rank still live: kill them
    # (signal(SIGKILL)); the rank becomes LOST once none is left.
    ORPHANED = "orphaned"


@dataclass(frozen=True)
class RankStatus:
    state: RankState
    exit_code: int | None = None
    cause: str | None = None  # set when the platform ended it (see the module doc)


Handle = dict[str, Any]
"""A JSON-able record that lets any broker process find the rank's process again."""


class Executor(Protocol):
    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False, node: str | None = None) -> Handle: ...

    def status(self, handle: Handle) -> RankStatus: ...

    def signal(self, handle: Handle, sig: int) -> None: ...


# -- renting capacity -------------------------------------------------------------------------

TAG_BROKER, TAG_POOL, TAG_NODE, TAG_JOB = "onepool-broker", "onepool-pool", "onepool-node", "onepool-job"


class InstanceState(StrEnum):
    PENDING = "pending"  # asked for, not ready yet
    RUNNING = "running"
    STOPPING = "stopping"  # being reclaimed or shut down
    GONE = "gone"  # terminated, deleted, preempted: it will not come back


@dataclass(frozen=True)
class Offer:
    """One thing a provider can rent: an instance type in a region/zone and market."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    gpus: int
    market: str  # on_demand | spot
    usd_per_hour: float | None  # per node; None: unknown (the catalog fills it)
    zone_id: str | None = None  # AWS: the AZ id (use1-az1) of `zone` (us-east-1a), which differs per account

    @property
    def usd_per_gpu_hour(self) -> float | None:
        return None if self.usd_per_hour is None else self.usd_per_hour / self.gpus


@dataclass(frozen=True)
class LaunchRequest:
    """What the broker asks for. `token` is derived from the broker's node id, written to the
    database BEFORE launch() is called, so a retry after a crash reuses it."""

    token: str
    broker_id: str
    pool: str
    node_id: str
    job_id: int | None
    instance_type: str
    market: str  # on_demand | spot
    zone: str | None = None
    image: str | None = None
    user_data: str = ""  # the bootstrap (see providers.bootstrap)

    def tags(self) -> dict[str, str]:
        """The tags/labels every resource carries."""
        return {TAG_BROKER: self.broker_id, TAG_POOL: self.pool, TAG_NODE: self.node_id,
                TAG_JOB: "" if self.job_id is None else str(self.job_id)}


@dataclass(frozen=True)
class Instance:
    """A rented node as the provider sees it."""

    instance_id: str
    state: InstanceState
    tags: Mapping[str, str] = field(default_factory=dict)
    zone: str | None = None
    market: str | None = None

    @property
    def node_id(self) -> str | None:
        return self.tags.get(TAG_NODE)


@dataclass(frozen=True)
class Interruption:
    """A notice that the provider will reclaim (or has reclaimed) an instance.

    `key` names the notice at its source (a queue message id, an operation name): the same
    notice delivered twice has the same key. `receipt` is what ack() needs to delete it."""

    instance_id: str
    kind: str  # spot_interruption | rebalance | preempted
    deadline: float | None = None  # epoch seconds when it goes, if known
    key: str | None = None
    receipt: str | None = None

    @property
    def identity(self) -> str:
        """The notice's key, or one made of its content when the source gives none."""
        return self.key or f"{self.kind}:{self.instance_id}:{self.deadline}"


class NoticeLog(Protocol):
    """Where a provider remembers the notices the broker acknowledged (ack()) that it read
    from a cloud's API with no queue to delete from (GCP's `compute.instances.preempted`
    operations), so each stops being reported once recorded, across broker restarts and
    every zone of the pool. The broker's is its database (broker.state.notices.DbNoticeLog);
    MemoryNoticeLog serves tests and stand-alone use."""

    def seen(self, key: str) -> bool:
        """Whether the notice `key` (unique per pool, e.g. the operation's name) was recorded."""
        ...

    def add(self, key: str, instance_id: str, kind: str, scope: str) -> bool:
        """Record a notice; False if it was already recorded (then do not report it again)."""
        ...


class MemoryNoticeLog:
    """A NoticeLog in memory (forgets on restart)."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, str, str]] = {}

    def seen(self, key: str) -> bool:
        return key in self.keys

    def add(self, key: str, instance_id: str, kind: str, scope: str) -> bool:
        if key in self.keys:
            return False
        self.keys[key] = (instance_id, kind, scope)
        return True


class Provider(Protocol):
    """Rents nodes. Every implementation keeps this contract (tests/providers/ checks it):

    - launch(req) is idempotent on req.token: a second call with the same token (also from
      another broker process after a crash) returns the instance the first one created,
      never a second instance. It returns as soon as the instance exists (maybe PENDING).
    - every instance carries req.tags() as tags/labels (broker, pool, node and job ids).
    - terminate(instance_id) of an instance that is gone or unknown returns quietly.
    - poll(broker_id) lists the instances tagged with this broker that are not GONE
      (the broker uses it to find orphans and lost nodes; a listing may miss an instance).
    - describe(instance_id) looks one instance up by id (not through the listing): None
      when it is gone or unknown. The broker confirms a node lost, and terminated, with it.
    - interruptions() returns notices not yet acknowledged (it may return one again: the
      broker records each by its key, once), [] if the provider has no such channel.
    - ack(notices) deletes notices the broker has recorded from their queue; acking one
      twice, or one that has no queue, is quiet. At-least-once: record, then ack.
    - offers() lists what it can rent, with prices when the API gives them.
    - errors: NoCapacity (try another pool), Transient (retried inside with backoff, raised
      only when retries ran out), Fatal (fix the config or credentials). Nothing else
      escapes: SDK exceptions are mapped.
    """

    name: str

    def offers(self) -> list[Offer]: ...

    def launch(self, req: LaunchRequest) -> Instance: ...

    def terminate(self, instance_id: str) -> None: ...

    def poll(self, broker_id: str) -> list[Instance]: ...

    def describe(self, instance_id: str) -> Instance | None: ...

    def interruptions(self) -> list[Interruption]: ...

    def ack(self, notices: list[Interruption]) -> None: ...

"""What the leader keeps across cycles (issue 27): the pending jobs, the attempts not ended and
their jobs, the pending queue plan() walks, and the "why waiting" reasons as written, so a
cycle reads and writes only what changed since the last one.

How it learns what changed: every insert and update of a job or attempt row takes the next
number of a one-row counter into the row's `change_seq`, by a database trigger (migration
0023), so every writer is counted: the ORM, a core UPDATE (the SDK's cancel), another process.
A refresh reads the counter first (N), then the rows numbered above the last N it read.
That misses nothing on either database:

- PostgreSQL: the trigger's UPDATE of the counter row holds the row's lock until its writer
  commits, so a writer that took number k committed before any other could take k + 1:
  numbers become visible in the order they were given (no commit "behind" the counter). A
  reader that saw N has therefore been able to see every row numbered <= N; the rows it reads
  above N are read again next time (harmless). The price: writers of job and attempt rows
  queue for the counter row until they commit (their transactions are short).
- SQLite: one writer at a time; the same holds.

The database stays the truth: a new leader, or this one after its lease was lost (another
fencing number), rebuilds everything from a full read (`reset()`); tests/test_kept.py
checks that what is kept equals a fresh read after any sequence of changes.

"Why waiting" is written only for the jobs whose reason changed, one UPDATE per reason, and
not counted as a change (the leader knows what it wrote; see write_reasons).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import case, update
from sqlmodel import Session, col, select

from broker.control.holds import COLUMNS as HOLD_COLUMNS
from broker.control.holds import Waiting
from broker.control.snapshots import (
    FairShareUsage,
    assemble,
    code_held,
    estimate,
    failed_start_nodes,
    pending_view,
    runtime_history,
)
from broker.policy import PendingView, PolicyConfig, RunningView, Snapshot
from broker.policy.estimates import RuntimeHistory
from broker.policy.queue import PendingQueue
from broker.policy.reclaim_index import ReclaimIndex
from broker.policy.warm import warm_nodes
from broker.state.model import Attempt, AttemptState, ChangeCounter, Job, JobState

COUNTER = "rows"
JOB_COLUMNS = (Job.id, Job.team, Job.experiment, Job.priority, Job.gpus_per_node, Job.nodes,
               Job.submit_time, Job.gpu_types, Job.spot, Job.expected_duration_s,
               Job.checkpoint_interval_s, Job.preemptions, Job.state, Job.cancel_requested,
               Job.waiting_reason, *HOLD_COLUMNS[1:], Job.deadline_where, Job.code_sha256,
               Job.image)
ATTEMPT_COLUMNS = (Attempt.id, Attempt.job_id, Attempt.alloc, Attempt.state, Attempt.started_at,
                   Attempt.last_checkpoint_at, Attempt.preempted_by, Attempt.stop_reason, Attempt.gpus)
# the columns a pending view and its holds read (a change elsewhere keeps the view)
VIEW_KEYS = tuple(c.key for c in (*JOB_COLUMNS[1:12], *HOLD_COLUMNS[1:], Job.deadline_where,
                                   Job.code_sha256, Job.image))
LIVE = (JobState.PENDING, JobState.RUNNING)
UPDATES_PER_QUERY = 5000
# what the leader's reasons write sets change_seq to: another number <= 0, which the triggers
# do not count (migration 0023)
NOT_COUNTED = case((col(Job.change_seq) == 0, -1), else_=0)


def counter(s: Session) -> int:
    """The change counter now (0 on a database without one yet)."""
    return int(s.exec(select(ChangeCounter.n).where(ChangeCounter.name == COUNTER)).first() or 0)


@dataclass(frozen=True)
class Refreshed:
    """What one refresh found: the jobs and attempts it read again (0 and 0: nothing changed)."""

    jobs: int
    attempts: int
    rebuilt: bool


class KeptState:
    """The leader's state across cycles. Not thread-safe: the engine's cycle owns it.

    `refresh(s)` applies what changed since the last refresh (the first one, or one after
    `reset()`, reads everything); `snapshot(...)` assembles the policy's Snapshot from it with
    the kept PendingQueue; `write_reasons(s, waiting)` writes the reasons that changed.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next refresh rebuilds from a full read."""
        self.seen: int | None = None  # the counter as of the last refresh
        self.fencing: int | None = None  # the lease's number the state was built under
        self.jobs: dict[int, Any] = {}  # job rows (JOB_COLUMNS): pending, running, or with an attempt
        self.attempts: dict[int, Any] = {}  # attempts not ended (ATTEMPT_COLUMNS)
        self.views: dict[int, PendingView] = {}  # pending jobs not cancel-requested
        self.reasons: dict[int, str | None] = {}  # every pending job's waiting reason as written
        self.holds: dict[int, tuple[Any, ...]] = {}  # pending jobs with a hold field (HOLD_COLUMNS)
        self.history = RuntimeHistory()
        self.by_key: dict[tuple[str, str], set[int]] = defaultdict(set)  # learned estimates' users
        # pending jobs by (code snapshot, image) (issue 26: broker.policy.warm)
        self.by_code: dict[tuple[str | None, str | None], set[int]] = defaultdict(set)
        self.held: dict[str, frozenset[str]] = {}  # node -> code digests and images its agent holds
        self.queue = PendingQueue()
        self._queued: dict[int, PendingView] = {}  # what `queue` holds
        self._dirty: set[int] = set()  # jobs whose view changed since the last sync_queue
        self._built: tuple[PendingView, ...] | None = None  # the last snapshot's pending, as built
        self._queued_all = True  # `queue` held exactly `views` after the last sync_queue
        self.reclaim: ReclaimIndex | None = None  # the running attempts indexed for preemption
        self._indexed: dict[int, RunningView] = {}  # what `reclaim` holds

    # -- reading ----------------------------------------------------------------------------
    def refresh(self, s: Session, fencing: int | None = None) -> Refreshed:
        """Apply the rows changed since the last refresh; everything when there was none, or
        when `fencing` (the caller's lease number) differs from the one the state was built
        under (the database may have changed under another leader meanwhile)."""
        if fencing != self.fencing:
            self.reset()
            self.fencing = fencing
        n = counter(s)  # first: every row numbered up to n is visible to the reads below
        rebuilt = self.seen is None
        self._rewarm(code_held(s))  # agents' reports are not numbered: read each cycle (few rows)
        if rebuilt:
            jobs = s.exec(select(*JOB_COLUMNS).where(col(Job.state).in_(LIVE))).all()
            attempts = s.exec(select(*ATTEMPT_COLUMNS).where(Attempt.state != AttemptState.ENDED)).all()
        elif n == self.seen:
            return Refreshed(0, 0, False)
        else:
            jobs = s.exec(select(*JOB_COLUMNS).where(Job.change_seq > self.seen)).all()
            attempts = s.exec(select(*ATTEMPT_COLUMNS).where(Attempt.change_seq > self.seen)).all()
        self.seen = n
        for a in attempts:
            if a.state == AttemptState.ENDED:
                self.attempts.pop(a.id, None)
            else:
                self.attempts[a.id] = a
        owners = {a.job_id for a in self.attempts.values()}
        history_changed = rebuilt or any(j.state == JobState.SUCCEEDED for j in jobs)
        changed_pending: list[int] = []
        for j in jobs:
            old = self.jobs.get(j.id)
            if (old is not None and j.state == JobState.PENDING == old.state and j.id in self.views
                    and not j.cancel_requested and _same_view(old, j)):
                self.jobs[j.id] = j  # only its reason (or another column no view reads) changed
                self.reasons[j.id] = j.waiting_reason
                continue
            self._drop(j.id)
            if j.state in LIVE or j.id in owners:
                self.jobs[j.id] = j
            if j.state == JobState.PENDING:
                self.reasons[j.id] = j.waiting_reason
                if any(v is not None and v != [] for v in (j.array_limit, j.not_before, j.after, j.held_by)):
                    self.holds[j.id] = tuple(getattr(j, c.key) for c in HOLD_COLUMNS)
                if not j.cancel_requested:
                    changed_pending.append(j.id)
        missing = owners - self.jobs.keys()  # attempts whose jobs are no longer pending or running
        for j in s.exec(select(*JOB_COLUMNS).where(col(Job.id).in_(missing))).all() if missing else ():
            self.jobs[j.id] = j
        if history_changed:
            self._relearn(runtime_history(s))
        failed = failed_start_nodes(s, job_ids=changed_pending) if changed_pending else {}
        for jid in changed_pending:
            self._view(self.jobs[jid], failed.get(jid, frozenset()))
        return Refreshed(len(jobs), len(attempts), rebuilt)

    def _drop(self, jid: int) -> None:
        self._dirty.add(jid)
        j = self.jobs.pop(jid, None)
        self.views.pop(jid, None)
        self.reasons.pop(jid, None)
        self.holds.pop(jid, None)
        if j is not None:
            self.by_key.get((j.team, j.experiment), set()).discard(jid)
            if j.code_sha256 is not None or j.image is not None:
                self.by_code.get((j.code_sha256, j.image), set()).discard(jid)

    def _view(self, j: Any, failed_on: frozenset[str]) -> None:
        self._dirty.add(j.id)
        self.views[j.id] = pending_view(j, estimate(self.history, j), failed_on,
                                        warm_nodes(j.code_sha256, self.held, j.image))
        if j.code_sha256 is not None or j.image is not None:
            self.by_code[(j.code_sha256, j.image)].add(j.id)
        if j.expected_duration_s is None:
            self.by_key[(j.team, j.experiment)].add(j.id)

    def _rewarm(self, held: dict[str, frozenset[str]]) -> None:
        """The agents now hold `held` (node -> code digests): the pending views whose warm
        nodes changed (broker.policy.warm) are redone."""
        if held == self.held:
            return
        old, self.held = self.held, held
        for (code, image), ids in self.by_code.items():
            now = warm_nodes(code, held, image)
            if ids and now != warm_nodes(code, old, image):
                for jid in ids:
                    v = self.views.get(jid)
                    if v is not None:
                        self.views[jid] = replace(v, warm_on=now)
                        self._dirty.add(jid)

    def _relearn(self, history: RuntimeHistory) -> None:
        """New runtime history: the pending views whose learned estimate changed are redone."""
        old, self.history = self.history, history
        for key, ids in self.by_key.items():
            if ids and old.estimate(key) != history.estimate(key):
                for jid in ids:
                    v = self.views.get(jid)
                    if v is not None:
                        self.views[jid] = replace(v, expected_duration_s=history.estimate(key))
                        self._dirty.add(jid)

    # -- what the cycle reads -------------------------------------------------------------------
    def waiting(self) -> Waiting:
        """What the holds read of the pending jobs (broker.control.holds.Waiting)."""
        return Waiting.of(self.holds.values())

    def snapshot(self, s: Session, now: float, config: PolicyConfig, half_life_s: float,
                 usage: FairShareUsage | None) -> Snapshot:
        """The snapshot build_snapshot would read, from what is kept (pools and teams are read:
        they are few). Its queue is kept: `sync_queue` makes it hold what a later step left."""
        jobs = self.jobs
        active = [(a, jobs[a.job_id]) for a in self.attempts.values()]
        self._built = tuple(self.views.values())
        return assemble(s, now, config, half_life_s, usage, active, self._built, self.history)

    def sync_queue(self, snap: Snapshot) -> Snapshot:
        """`snap` with the kept queue and reclaim index (broker.policy.queue, reclaim_index),
        made to hold exactly `snap.pending` and `snap.running` (the views later steps left:
        holds, budgets, moves), changing only what differs: when no later step changed the
        pending views, only the jobs changed since the last sync are looked at."""
        snap = replace(snap, reclaim_index=self._reclaim(snap))
        queue, queued = self.queue, self._queued
        dirty, self._dirty = self._dirty, set()
        if snap.pending is self._built and self._queued_all:
            views = self.views
            for jid in dirty:
                old, new = queued.get(jid), views.get(jid)
                if old is not new:
                    if old is not None:
                        queue.remove(old)
                        del queued[jid]
                    if new is not None:
                        queue.add(new)
                        queued[jid] = new
            return replace(snap, queue=queue)
        now = {p.job_id: p for p in snap.pending}
        for jid, v in queued.items():
            if now.get(jid) is not v:
                queue.remove(v)
        for jid, v in now.items():
            if queued.get(jid) is not v:
                queue.add(v)
        self._queued = now
        self._queued_all = snap.pending is self._built
        return replace(snap, queue=queue)

    def _reclaim(self, snap: Snapshot) -> ReclaimIndex:
        cfg = snap.config
        aged_after = cfg.promote_after_s if cfg.classes else None
        ix = self.reclaim
        if ix is None or ix.aged_after != aged_after or ix.gangs_only != cfg.promote_gangs_only:
            ix = self.reclaim = ReclaimIndex((), aged_after, cfg.promote_gangs_only)
            self._indexed = {}
        was = self._indexed
        now = {r.attempt_id: r for r in snap.running}
        for aid, r in was.items():
            new = now.get(aid)
            if new is None:
                ix.remove(r)
            elif new != r:
                ix.update(r, new)
        for aid, new in now.items():
            if aid not in was:
                ix.add(new)
        self._indexed = now
        return ix

    # -- writing ------------------------------------------------------------------------------
    def write_reasons(self, s: Session, waiting: Mapping[int, str]) -> int:
        """Write "why waiting" for the pending jobs whose reason changed (None for a pending job
        not in `waiting`), one UPDATE per reason, only while the job is still pending and
        unchanged since the last refresh (a changed one is read again next time, and its reason
        written then). The write sets change_seq to 0 or -1: the triggers do not count it (migration
        0023), so it is not read back. Returns how many jobs it meant to write."""
        by_reason: dict[str | None, list[int]] = defaultdict(list)
        seen = self.seen or 0
        get = waiting.get
        for jid, was in self.reasons.items():
            why = get(jid)
            if why != was:
                by_reason[why].append(jid)
        for why, ids in by_reason.items():
            for i in range(0, len(ids), UPDATES_PER_QUERY):
                chunk = ids[i:i + UPDATES_PER_QUERY]
                s.execute(update(Job).where(col(Job.id).in_(chunk), Job.state == JobState.PENDING,
                                            Job.change_seq <= seen)
                          .values(waiting_reason=why, change_seq=NOT_COUNTED)
                          .execution_options(synchronize_session=False))
            for jid in ids:
                self.reasons[jid] = why
        return sum(map(len, by_reason.values()))


def _same_view(a: Any, b: Any) -> bool:
    return all(getattr(a, k) == getattr(b, k) for k in VIEW_KEYS)


def fresh(s: Session) -> KeptState:
    """A state built from a full read now (what a new leader starts from)."""
    k = KeptState()
    k.refresh(s)
    return k


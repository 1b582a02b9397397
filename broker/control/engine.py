"""The broker's cycle: read -> snapshot -> plan -> apply -> record, on an injected clock.

Every step commits the database BEFORE it acts on the world (signal, start), and every
action is idempotent, so a broker killed at any point and restarted (reconcile()) neither
loses a job nor runs one twice:
- an attempt row is written LAUNCHING before its processes start; reconcile() completes the
  start, which finds processes a crashed broker had already started instead of starting more;
- a preemption is written STOPPING before the signal; reconcile() signals again;
- processes outlive the broker; their exit status is on disk, so an attempt that ended while
  no broker ran is ended correctly on the next poll.

Only the leader acts: every session the engine opens is fenced by its lease
(broker.control.lease), so once another broker takes over, this one's writes raise
LeaseLost. One attempt's failure stays its own (broker.control.guards).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlmodel import Session, col, select

from broker.checkpoint import index as ckpt_index
from broker.checkpoint.telemetry import cause_of
from broker.clock import Clock
from broker.control import agents, budgets, deadlines, holds, intervals, phases_rec, retries
from broker.control.capacity_manager import CapacityManager
from broker.control.config_apply import applied_config
from broker.control.duties import Duties
from broker.control.executors import Executors
from broker.control.guards import BROKER_CAUSES
from broker.control.kept import KeptState
from broker.control.launching import Launching
from broker.control.lease import FencedStore, Lease, lease_row
from broker.control.rebalancer import Rebalancer
from broker.crashpoints import crash_point
from broker.errors import NotLeader
from broker.observe.metrics import CYCLE_SECONDS, PLAN_SECONDS
from broker.policy import Plan, PolicyConfig, Preemption, plan
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, EndReason, Job, JobState, Node, NodeState
from broker.state.store import Store
from broker.wire import SERVER_UNREACHABLE
from providers import start_errors
from providers.base import Executor, RankState

log = logging.getLogger("onepool.engine")
REQUEUE = (EndReason.PREEMPTED, EndReason.LOST, EndReason.INTERRUPTED, EndReason.REBALANCED)
STOP_REASONS = {"preempted": EndReason.PREEMPTED, "interrupted": EndReason.INTERRUPTED,
                "rebalanced": EndReason.REBALANCED,
                "cancelled": EndReason.CANCELLED, "budget": EndReason.BUDGET, "lost": EndReason.LOST}
CHECKPOINT_NOW = signal.SIGUSR1  # the runtime's "checkpoint now, keep running" request


@dataclass
class CycleReport:
    started: list[int] = field(default_factory=list)  # job ids
    ended: list[tuple[int, str]] = field(default_factory=list)  # (job id, end reason)
    preempted: list[int] = field(default_factory=list)  # victim job ids
    killed: list[int] = field(default_factory=list)  # job ids killed after their grace
    plan: Plan | None = None


class Engine(Launching, Duties):
    """Runs cycles over one broker home. Not thread-safe: one engine per home at a time.

    Its periodic duties (broker.control.duties) run in every cycle, unless the leader's
    schedule drives them (`duties_scheduled`, set by broker.control.scheduled).

    The engine acts only as the leader: it holds `lease` (taken here when none is given;
    NotLeader if another broker holds it), and every session it opens is fenced
    (broker.control.lease): once another broker takes the lease, its writes raise LeaseLost.
    """


    def __init__(self, store: Store, clock: Clock, executor: Executor | None = None,
                 policy: PolicyConfig | None = None, lease: Lease | None = None) -> None:
        self.clock = clock
        with store.session() as s:
            self.config = applied_config(s)
        self.settings = self.config.broker
        self._own_lease = lease is None
        if lease is None:
            lease = Lease(store, clock, self.settings.lease_s)
            if not lease.try_acquire():
                row = lease_row(store)
                raise NotLeader(f"broker {row.holder} holds the lease (fencing number {row.fencing}) "
                                f"for {max(0.0, row.expires_at - clock.now()):.0f}s more")
        self.lease = lease
        self.term_started = clock.now()  # agents' silence counts from here at the earliest
        self.store = FencedStore(store, lease)
        self.executor: Executor = executor or Executors(self.store, clock, store.home / "runs")
        if isinstance(self.executor, Executors):
            self.executor.agents.store = self.store  # rank assignments are fenced writes too
        self.policy = policy or PolicyConfig.from_settings(self.settings, "broker")
        self.capacity = CapacityManager(self)  # rented pools (issue 4); providers built lazily
        # Slurm pools (issue 14): their nodes are read from Slurm each cycle; the executor runs them
        self.slurm = self.executor.slurm if isinstance(self.executor, Executors) else None
        self.rebalancer = Rebalancer(self)  # moves to cheaper capacity (issue 12)
        self.interval_inputs = intervals.CycleInputs()  # issue 31: made afresh at each snapshot
        self.team_budgets: list[budgets.TeamBudget] = []  # as of the last cycle
        self._team_budget_state: dict[str, str] = {}  # money (issue 6): last team budget states
        self.held: dict[int, str] = {}  # jobs held out of the last snapshot, and why (issue 29)
        self.kept = KeptState()  # issue 27: the queue and running set across cycles
        self._quarantined: set[int] = set()  # attempts that fail even to be failed (skipped)
        self.wake: Callable[[], None] = lambda: None  # the loop's "cycle now" (service.run sets it)

    def close(self) -> None:
        """Stop background cloud work; give the lease back if this engine took it itself."""
        self.capacity.close()
        if self._own_lease:
            self.lease.release()

    # -- start-up ---------------------------------------------------------------------------
    def reconcile(self) -> None:
        """After a (re)start: finish half-done launches and re-send pending stop signals.
        One attempt that cannot be reconciled fails alone (see _contained)."""
        now = self.clock.now()
        self.capacity.reconcile(now)  # [issue 4 hook] orphans terminated, lost nodes ended
        for aid in self._open_attempts():
            with self._contained("reconcile", aid), self.store.session() as s:
                a = s.get(Attempt, aid)
                job = s.get(Job, a.job_id) if a is not None else None
                if a is None or job is None or a.state == AttemptState.ENDED:
                    continue
                if a.state == AttemptState.LAUNCHING or (a.state == AttemptState.RUNNING
                                                         and len(a.handles) < len(a.alloc)):
                    if self._start_or_fail(s, a, job, now, recover=True):
                        a.state = AttemptState.RUNNING
                        record(s, now, "reconciled", "launch completed after a broker restart",
                               job_id=job.id, attempt_id=a.id)
                    s.add(a)
                elif a.state == AttemptState.STOPPING:
                    for h in a.handles:
                        self.executor.signal(h, signal.SIGKILL if a.stop_reason == "failed"
                                             else signal.SIGTERM)

    # -- the cycle ------------------------------------------------------------------------
    def cycle(self) -> CycleReport:
        """One scheduling round. Returns what it did. Its wall time (and plan()'s) goes to this
        process's histograms onepool_cycle_duration_seconds and onepool_plan_duration_seconds
        (a cycle that raised too)."""
        with CYCLE_SECONDS.time():
            try:
                return self._cycle()
            except BaseException:
                self.kept.reset()  # what it kept may hold writes that were rolled back
                raise

    def _cycle(self) -> CycleReport:
        rep = CycleReport()
        self.store.ensure()  # a broker that was paused longer than its lease stops here
        now = self.clock.now()
        with self.store.session() as s:  # [issue 27] what changed since the last cycle, read alone
            self.kept.refresh(s, self.lease.fencing)
        with self.store.session() as s:
            self._cancel_requested(s, now)
            holds.end_never_met(s, now, self.kept.waiting())  # [issue 29 hook] never-met dependencies
        self._watch_agents(now)
        if self.slurm is not None:  # [issue 14 hook] Slurm nodes, free GPUs and job states
            self.slurm.sync(now)
        self._poll(now, rep)
        if self.duties_scheduled:  # [issue 12] the duties run as the leader's scheduled tasks
            self.charge(now)  # money (issue 6): the ledger and team budgets, every cycle
        else:
            self.enforce_budgets(now)  # money (issue 6): charge the ledger, enforce budgets
        with self.store.session() as s:
            self._refresh_checkpoints(s, now)
        if not self.duties_scheduled:
            self.retain_checkpoints(now)
            self.decay_fair_share(now)
        self.capacity.sync(now)  # [issue 4 hook] launches finished, notices acted on, idleness
        self.rebalancer.advance(now, rep)  # [issue 12 hook] in-flight moves: checkpoint, stop, place
        deadlines.cycle(self, now)  # [issue 31 hook] where jobs with deadlines may run; off spot
        with self.store.session() as s:
            snap = self.snapshot(s, now)
            self.interval_inputs = intervals.CycleInputs({v.name: v.interruption_rate_per_h
                                                          for v in snap.pools})  # [issue 31]
            with PLAN_SECONDS.time():
                p = plan(snap)
            rep.plan = p
            self.kept.write_reasons(s, {**self.held, **dict(p.waiting)})  # held: broker.control.holds
        for pre in p.preemptions:
            self._preempt(pre, now, rep)
        for pl in p.placements:
            self._launch(pl, now, rep)
        self.capacity.apply(self.cycle_plan(p), now)  # [issue 4 hook] launches / idle terminations
        return rep

    def _watch_agents(self, now: float) -> None:
        """Agents silent too long: an on-prem node's ranks are LOST (the poll below ends and
        requeues their attempts); a rented node is terminated (its work ends once it is
        confirmed gone). Silence counts from the start of this engine's term at the earliest:
        agents could not call in while no broker led, and get a whole timeout to do so."""
        with self.store.session() as s:
            seen = agents.watch(s, now, self.settings.node_lost_after_s, since=self.term_started)
        for node in seen.rented_lost:
            self.capacity.agent_lost(node, now)

    def _cancel_requested(self, s: Session, now: float) -> None:
        for j in s.exec(select(Job).where(col(Job.cancel_requested).is_(True),
                                          Job.state.in_([JobState.PENDING, JobState.RUNNING]))):
            if j.state == JobState.PENDING:
                j.state, j.end_time = JobState.CANCELLED, now
                record(s, now, "cancelled", "cancelled while pending", job_id=j.id)
                s.add(j)
                continue
            for a in s.exec(select(Attempt).where(Attempt.job_id == j.id,
                                                  Attempt.state == AttemptState.RUNNING)):
                with self._contained("cancel", a.id):
                    self._request_stop(s, a, now, "cancelled")

    def _request_stop(self, s: Session, a: Attempt, now: float, reason: str,
                      by: int | None = None) -> None:
        a.state, a.stop_requested_at, a.stop_reason, a.preempted_by = (
            AttemptState.STOPPING, now, reason, by)
        s.add(a)
        s.commit()  # the intent is durable before the signal
        crash_point("preempt_grace")
        for h in a.handles:
            self.executor.signal(h, signal.SIGTERM)

    def _poll(self, now: float, rep: CycleReport) -> None:
        ids = self._open_attempts((AttemptState.RUNNING, AttemptState.STOPPING))
        if isinstance(self.executor, Executors):
            self.executor.refresh(ids)  # agents' reports, read once for all ranks
        for aid in ids:
            with self._contained("poll", aid), self.store.session() as s:
                a = s.get(Attempt, aid)
                if a is not None and a.state in (AttemptState.RUNNING, AttemptState.STOPPING):
                    phases_rec.poll(s, a, self.executor, now)  # its restart phases (issue 26)
                    self._poll_one(s, a, now, rep)

    def _poll_one(self, s: Session, a: Attempt, now: float, rep: CycleReport) -> None:
        st = [self.executor.status(h) for h in a.handles]
        alive = [x for x in st if x.state in (RankState.RUNNING, RankState.ORPHANED)]
        orphaned = [h for h, x in zip(a.handles, st, strict=True) if x.state == RankState.ORPHANED]
        if orphaned:  # a supervisor died: what it left must die before the attempt may end
            for h in orphaned:
                self.executor.signal(h, signal.SIGKILL)
            record(s, now, "orphans_killed", f"the supervisor of rank(s) {[h['rank'] for h in orphaned]} "
                   "died; the processes it left were killed", job_id=a.job_id, attempt_id=a.id)
        if alive:
            failed = any(x.state == RankState.EXITED and x.exit_code for x in st)
            lost = orphaned or any(x.state == RankState.LOST for x in st)
            if (failed or lost) and a.state == AttemptState.RUNNING:
                if lost and not failed:
                    a.cause = a.cause or next((x.cause for x in st if x.state == RankState.LOST
                                               and x.cause), "supervisor_lost")
                self._request_stop(s, a, now, "failed" if failed else "lost")
            elif a.state == AttemptState.STOPPING and a.stop_requested_at is not None:
                crash_point("preempt_grace")
                if now - a.stop_requested_at >= self.settings.grace_s:
                    for h in a.handles:
                        self.executor.signal(h, signal.SIGKILL)
                    record(s, now, "killed", f"still running {self.settings.grace_s:g}s after "
                           "SIGTERM: killed", job_id=a.job_id, attempt_id=a.id)
                    rep.killed.append(a.job_id)
            return
        codes = [x.exit_code for x in st]
        all_ok = len(st) == len(a.alloc) and all(x.state == RankState.EXITED and x.exit_code == 0
                                                  for x in st)
        lost = any(x.state == RankState.LOST for x in st)
        if lost and a.cause is None and self._on_gone_node(s, a):
            a.cause = "node_lost"
        no_start = next((x.cause for x in st if start_errors.is_start_failure(x.cause)), None)
        if all_ok:
            reason = EndReason.COMPLETED
        elif a.stop_reason in STOP_REASONS:
            reason = STOP_REASONS[a.stop_reason]
        elif no_start is not None or start_errors.is_start_failure(a.cause):
            a.cause = a.cause if start_errors.is_start_failure(a.cause) else no_start
            reason = EndReason.FAILED  # a rank could not start: _end decides whether it retries
        elif a.stop_reason is None and (cause := next((x.cause for x in st if x.cause), None)):
            a.cause = cause  # the platform ended it (issue 14: Slurm preempted it, a node failed)
            lost_by = ("node_failure", SERVER_UNREACHABLE)  # the node or its link, not a notice
            reason = EndReason.LOST if cause in lost_by else EndReason.INTERRUPTED
        elif a.stop_reason == "failed" or not lost:
            reason = EndReason.FAILED
        else:
            reason = EndReason.LOST
        job = s.get(Job, a.job_id)
        if reason in REQUEUE and job is not None and ckpt_index.declared_done(job, a):
            # Its ranks finished (runtime.done() is in the store) before their exit could be
            # reported: the node was lost, the instance reclaimed. Running it again would
            # repeat work the job declared finished.
            record(s, now, "done_unreported", f"attempt {a.number}: every rank had declared itself "
                   f"done before it ended {reason.value}; completed", job_id=a.job_id, attempt_id=a.id)
            reason, all_ok, codes = EndReason.COMPLETED, True, []
        code = next((c for c in codes if c), 0 if all_ok else None)
        keep = a.cause if reason == EndReason.FAILED and (
            a.cause in BROKER_CAUSES or start_errors.is_start_failure(a.cause)) else None
        self._end(s, a, now, reason, code, cause=keep)
        rep.ended.append((a.job_id, reason.value))

    @staticmethod
    def _on_gone_node(s: Session, a: Attempt) -> bool:
        """Whether a node of the attempt is confirmed gone or lost (its ranks died with it)."""
        return any(n is not None and n.state in (NodeState.TERMINATED, NodeState.LOST)
                   for n in (s.get(Node, node) for node, _ in a.alloc))

    def _end(self, s: Session, a: Attempt, now: float, reason: EndReason, code: int | None,
             cause: str | None = None) -> None:
        job = s.get(Job, a.job_id)
        assert job is not None
        self._refresh_job_checkpoints(s, job, a, now)
        a.state, a.ended_at, a.end_reason, a.exit_code = AttemptState.ENDED, now, reason, code
        a.cause = cause or cause_of(a, reason)
        if reason != EndReason.COMPLETED:
            since = a.started_at if a.last_checkpoint_at is None else max(a.started_at,
                                                                          a.last_checkpoint_at)
            a.lost_gpu_s = max(0.0, now - since) * a.gpus
        s.add(a)
        retry = (reason == EndReason.FAILED and start_errors.is_start_failure(a.cause)
                 and self._retry_start(s, job, a, now))
        if retry:  # a rank could not start, maybe for the node's reason: elsewhere next time
            job.state, job.queued_at = JobState.PENDING, now
        elif reason == EndReason.FAILED and retries.retry_failed(s, job, a, now, code):
            pass  # issue 29: its own failure, retried after a backoff (broker.control.retries)
        elif reason in REQUEUE:
            job.state, job.queued_at = JobState.PENDING, now
            if reason == EndReason.PREEMPTED:
                job.preemptions += 1
            msg = {EndReason.PREEMPTED: f"preempted for job {a.preempted_by}",
                   EndReason.INTERRUPTED: f"interrupted ({a.cause})",
                   EndReason.REBALANCED: "stopped at its checkpoint to move to cheaper capacity"}.get(
                reason, "processes vanished without an exit status")
            if a.cause == SERVER_UNREACHABLE:
                msg = "its ranks stopped themselves: their node could not reach the server (outage)"
            since = (f"since its checkpoint at step {a.reached_step}" if a.reached_step is not None
                     else "since it started: no checkpoint yet")
            record(s, now, reason.value.lower(), f"{msg}; back in the queue (lost "
                   f"{a.lost_gpu_s:.0f} GPU-s {since})",
                   job_id=job.id, attempt_id=a.id, lost_gpu_s=a.lost_gpu_s,
                   preempted_by=a.preempted_by, cause=a.cause,
                   restart_overhead_s=a.restart_overhead_s)
            if reason == EndReason.PREEMPTED and a.preempted_by is not None:
                by = s.get(Job, a.preempted_by)
                record(s, now, "caused_loss", f"preempting job {job.id} lost it {a.lost_gpu_s:.0f} "
                       f"GPU-s of work, charged to this job and team {by.team if by else '?'}",
                       job_id=a.preempted_by, victim=job.id, victim_attempt_id=a.id,
                       lost_gpu_s=a.lost_gpu_s, team=by.team if by else None)
        else:
            job.state = {EndReason.COMPLETED: JobState.SUCCEEDED,
                         EndReason.CANCELLED: JobState.CANCELLED,
                         EndReason.BUDGET: JobState.BUDGET_EXHAUSTED}.get(reason, JobState.FAILED)
            job.end_time = now
            record(s, now, job.state.lower(), f"attempt {a.number} ended: {reason.value}"
                   + (f" (exit code {code})" if code else "")
                   + (f" ({a.cause})" if start_errors.is_start_failure(a.cause) else ""),
                   job_id=job.id, attempt_id=a.id, exit_code=code, cause=a.cause)
        s.add(job)
        s.commit()

    # -- checkpoints ------------------------------------------------------------------------
    def _refresh_checkpoints(self, s: Session, now: float) -> None:
        rows = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
                      .where(Attempt.state != AttemptState.ENDED)).all()
        for a, j in rows:
            self._refresh_job_checkpoints(s, j, a, now)

    def _refresh_job_checkpoints(self, s: Session, job: Job, a: Attempt, now: float) -> None:
        """Index newly committed checkpoints; their time is when this broker first saw them."""
        try:
            ckpt_index.refresh_attempt(s, job, a, now)
        except OSError as e:  # the store is unreachable now: the next cycle tries again
            log.warning("job %s: cannot list checkpoints at %s (%s)", job.id,
                        ckpt_index.attempt_prefix(job, a), e)

    # -- requests from providers and users ---------------------------------------------------
    def request_checkpoint(self, attempt_id: int, reason: str) -> bool:
        """Ask a running attempt to checkpoint now and keep running (SIGUSR1 to every rank;
        broker.runtime honours it at the job's next `due()`). False if it is not running."""
        now = self.clock.now()
        with self.store.session() as s:
            a = s.get(Attempt, attempt_id)
            if a is None or a.state != AttemptState.RUNNING:
                return False
            record(s, now, "checkpoint_requested", f"checkpoint now: {reason}", job_id=a.job_id,
                   attempt_id=a.id, reason=reason)
        for h in a.handles:
            self.executor.signal(h, CHECKPOINT_NOW)
        return True

    def interrupt(self, attempt_id: int, cause: str = "spot_interruption") -> bool:
        """An interruption notice for the attempt's nodes (what a provider's interruptions()
        feeds in): checkpoint now, then stop (SIGTERM, grace, kill) and requeue, recording
        `cause`. Idempotent; False if the attempt is not running."""
        if not self.request_checkpoint(attempt_id, f"interruption notice ({cause})"):
            return False
        now = self.clock.now()
        with self.store.session() as s:
            a = s.get(Attempt, attempt_id)
            assert a is not None
            a.cause = cause
            record(s, now, "interrupting", f"{cause}: {self.settings.grace_s:g}s to checkpoint "
                   "and exit", job_id=a.job_id, attempt_id=a.id, cause=cause)
            self._request_stop(s, a, now, "interrupted")
        return True

    # -- acting on the plan -----------------------------------------------------------------
    def _preempt(self, pre: Preemption, now: float, rep: CycleReport) -> None:
        with self._contained("preempt", pre.attempt_id), self.store.session() as s:
            a = s.get(Attempt, pre.attempt_id)
            if a is None or a.state != AttemptState.RUNNING:
                return
            record(s, now, "preempting", f"SIGTERM for job {pre.for_job_id}; "
                   f"{self.settings.grace_s:g}s grace to checkpoint", job_id=a.job_id,
                   attempt_id=a.id, for_job=pre.for_job_id, est_lost_gpu_s=pre.lost_gpu_s)
            self._request_stop(s, a, now, "preempted", pre.for_job_id)
            rep.preempted.append(a.job_id)

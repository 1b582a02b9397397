"""The SDK, embedded: submit, inspect, cancel and wait for jobs straight on the database.

    from broker.sdk import Client
    c = Client()                                   # $ONEPOOL_HOME or ./.onepool
    job = c.submit(name="bert", team="nlp", command=["python", "train.py"],
                   gpus_per_node=2, priority="high", budget_usd=40)
    c.wait([job.id])

With ONEPOOL_URL set, `broker.sdk.Client()` returns the HTTP client (broker.client.http)
instead: same methods, same results, same errors. The API server itself runs this class on
behalf of each request's principal (the member or admin behind its token), so the rules of
who may do what live here, once, for both modes.

Every method raises SpecError (bad input), NotFound, InvalidState, NotConfigured or
Forbidden with a message that says what to fix.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, func, or_, select

from broker import output_log
from broker.checkpoint import telemetry
from broker.checkpoint.index import default_store_root, stores_of
from broker.client.code_submit import resolve_code
from broker.client.filters import check_filters
from broker.client.sdk_admin import AdminMixin
from broker.client.sdk_changes import ChangesMixin
from broker.client.sdk_estimate import EstimateMixin
from broker.client.sdk_money import MoneyMixin
from broker.client.submit_deps import resolve_after
from broker.client.submits import StagedSubmit, SubmitBatch, write_submits
from broker.client.waits import FINAL, wait_stopped
from broker.clock import Clock, SystemClock
from broker.control import budgets as budget_rules
from broker.control.config_apply import applied_config, apply_config
from broker.control.health import Health
from broker.control.health import health as broker_health
from broker.errors import InvalidState, NotFound, SpecError
from broker.spec import (
    MAX_ID,
    MAX_LOG_OFFSET,
    ClusterConfig,
    JobSpec,
    check_job_fits,
    load_config,
    parse_job,
)
from broker.state import access
from broker.state.access import check_user
from broker.state.events import acting_as, record
from broker.state.model import Attempt, Event, Job, JobState
from broker.state.store import Store
from broker.state.tokens import Principal, local_principal
from broker.state.views import EventInfo, JobInfo, LogChunk

STATES = [s.value for s in JobState]
MAX_PAGE = 1000
LOG_CHUNK = 1 << 20


def existing_workdir(workdir: str | None) -> str:
    """The job's working directory as an absolute path (default: the current directory).
    Raises SpecError naming `workdir` when it is not an existing directory: a job there
    could never start."""
    path = os.path.abspath(os.path.expanduser(workdir)) if workdir else os.getcwd()
    if not os.path.isdir(path):
        raise SpecError("job", [f"workdir: must be an existing directory (got {path!r})"])
    return path


def remote_workdir(workdir: str | None) -> str | None:
    """A working directory named over the API: on the node that runs the job, so it cannot be
    checked here; it must be absolute (None: the agent's own folder for the rank)."""
    if workdir is not None and not os.path.isabs(workdir):
        raise SpecError("job", [f"workdir: must be an absolute path on the nodes (got {workdir!r})"])
    return workdir


class Client(AdminMixin, EstimateMixin, ChangesMixin, MoneyMixin):
    """The embedded client. `principal` is who acts (default: the local user, with every
    right, as whoever can open the database file has them anyway)."""

    def __init__(self, home: str | os.PathLike[str] | None = None, *, url: str | None = None,
                 clock: Clock | None = None, store: Store | None = None,
                 principal: Principal | None = None) -> None:
        self.store = store or Store(home, url)
        self.clock = clock or SystemClock()
        self.principal = principal or local_principal()

    # -- configuration ----------------------------------------------------------------------
    def apply(self, config: ClusterConfig | str | Path) -> ClusterConfig:
        """Apply an onepool.yaml (path or parsed). Raises SpecError for bad content,
        Forbidden for a member."""
        self.principal.require_admin("applying a config (pools, teams, settings)")
        cfg = config if isinstance(config, ClusterConfig) else load_config(config)
        with self.store.session() as s, acting_as(self.principal.actor):
            apply_config(s, cfg)
        self.store.changed()
        return cfg

    def config(self) -> ClusterConfig:
        with self.store.session() as s:
            return applied_config(s)

    def checkpoint_root(self, cfg: ClusterConfig) -> str:
        return default_store_root(cfg, self.store.home)

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec | dict[str, Any] | None = None, /, *,
               priority: str | None = None, budget_usd: float | None = None,
               idempotency_key: str | None = None, **fields: Any) -> JobInfo:
        """Queue a job. `spec` (a JobSpec or dict) and keyword fields are merged, keywords win.

        A member submits for its own team (the default team when none is given). With an
        `idempotency_key`, a retried submit of the same spec returns the job the first one
        made; the same key with another spec is refused.

        Raises SpecError naming the bad field and the allowed values (unknown team, GPU type
        no pool has, a shape no pool can hold, ...), Forbidden (another team). Nothing is
        written on error.
        """
        data: dict[str, Any] = {}
        if isinstance(spec, JobSpec):
            data = spec.model_dump()
        elif isinstance(spec, dict):
            data = dict(spec)
        elif spec is not None:
            raise SpecError("job", [f"(root): expected a JobSpec or a dict, got {type(spec).__name__}"])
        data.update(fields)
        if priority is not None:
            data["priority"] = priority
        if budget_usd is not None:
            data["budget_usd"] = budget_usd
        js = self.prepare(data)
        with self.store.session() as s, acting_as(self.principal.actor):
            info = self.submit_in(s, js, idempotency_key)
        self.store.changed()
        return info

    def prepare(self, data: dict[str, Any]) -> JobSpec:
        """The validated spec of a submit (the token's team by default). Raises SpecError,
        Forbidden."""
        p = self.principal
        if not p.is_admin and not data.get("team"):
            data = {**data, "team": p.team}
        js = parse_job(data)
        p.require_team(js.team, "submitting a job")
        return js

    def submit_in(self, s: Session, js: JobSpec, idempotency_key: str | None = None) -> JobInfo:
        """submit() inside the caller's transaction. Raises as submit() does; the caller rolls
        back what this wrote."""
        batch = SubmitBatch.read(s, [(self.principal, idempotency_key)])
        return write_submits(s, [self.stage_submit(s, batch, js, idempotency_key)])[0]

    def stage_submit(self, s: Session, batch: SubmitBatch, js: JobSpec,
                     idempotency_key: str | None) -> StagedSubmit:
        """Check a submit against the database without writing anything; write it (with the
        others of its `batch`) with write_submits(). A key used twice in one batch makes one
        job. Raises as submit() does, leaving the session as it found it."""
        p = self.principal
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
            raise SpecError("Idempotency-Key", ["must be 1 to 200 characters"])
        cfg = batch.cfg
        check_job_fits(js, cfg)
        code = resolve_code(js, local=p.kind == "local", store_root=default_store_root(cfg, self.store.home))
        js = code.spec
        digest = hashlib.sha256(json.dumps(js.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
        slot = (p.actor[:64], idempotency_key) if idempotency_key is not None else None
        if slot is not None:
            first = batch.staged.get(slot)
            if first is not None:
                if first.digest != digest:
                    raise SpecError("Idempotency-Key", [f"{slot[1]!r} was already used for a "
                                                        "different job; use a new key"])
                return StagedSubmit(self, digest, same_as=first)
            prior = batch.committed.get(slot)
            if prior is not None:
                if prior[0] != digest:
                    raise SpecError("Idempotency-Key", [f"{slot[1]!r} was already used for a "
                                                        f"different job (job {prior[1]}); use a new key"])
                return StagedSubmit(self, digest, prior=prior[1])
        now = self.clock.now()
        js, budget_note = budget_rules.check_submission(s, cfg, js, now, batch.overridden)  # money (issue 6)
        workdir = None if code.sha256 else existing_workdir(js.workdir) if p.kind == "local" \
            else remote_workdir(js.workdir)
        elements = js.elements()  # arrays, sweeps and dependencies (issue 29)
        after = resolve_after(s, self, js, [i for i, _, _ in elements])
        deadline = js.deadline_at(now)  # issue 31: broker.policy.deadlines
        if deadline is not None and deadline <= now:
            raise SpecError("job spec", [f"deadline: {js.deadline!r} is already past; give a later time"])
        jobs = [Job(name=js.name, experiment=js.experiment, team=js.team, command=command,
                    env=env, workdir=workdir, image=js.image,
                    gpus_per_node=js.gpus_per_node, nodes=js.nodes, gpu_types=js.gpu_types,
                    priority=js.priority.value, budget_usd=js.budget_usd, spot=js.spot.value,
                    checkpoint_interval_s=js.interval_hint_s, checkpoint_auto=js.checkpoint_auto,
                    expected_duration_s=js.expected_duration_s, submit_time=now, queued_at=now,
                    deadline=deadline, submitted_by=p.actor, user=p.person,
                    array_index=None if index < 0 else index,
                    array_limit=js.array_limit, retries=js.retries, retry_backoff_s=js.retry_backoff_s,
                    no_retry_exit_codes=js.no_retry_exit_codes, after=deps,
                     webhook_url=js.webhook_url, webhook_secret=js.webhook_secret,
                     code_sha256=code.sha256, code_uri=code.uri, setup=js.setup,
                     data=js.data)
                for (index, command, env), deps in zip(elements, after, strict=True)]
        staged = StagedSubmit(self, digest, js=js, job=jobs[0], more=jobs[1:], key=idempotency_key,
                              budget_note=budget_note, store_root=default_store_root(cfg, self.store.home))
        if slot is not None:
            batch.staged[slot] = staged
        return staged

    def _job(self, s: Session, job_id: int, what: str = "") -> Job:
        """The job, if this principal may see it. Another team's job is NotFound with the very
        message of a job that does not exist: a member cannot learn which ids other teams use.
        (`what` names the caller's purpose for readers of the call; the message is the same.)"""
        j = s.get(Job, job_id) if 0 < job_id <= MAX_ID else None
        if j is None or not self.principal.may_act_for(j.team):
            raise NotFound(f"no job with id {job_id}")
        return j

    def get(self, job_id: int) -> JobInfo:
        """The job with its attempts. Raises NotFound (also for another team's job)."""
        with self.store.session() as s:
            return self._info(s, job_id)

    def _info(self, s: Session, job_id: int) -> JobInfo:
        j = self._job(s, job_id)
        atts = list(s.exec(select(Attempt).where(Attempt.job_id == job_id)).all())
        return JobInfo.of(j, atts, self.clock.now(), stores=stores_of(s, [job_id]).get(job_id),
                          caused_lost_gpu_s=telemetry.caused_lost_gpu_s(s, [job_id]).get(job_id, 0.0))

    def list(self, *, status: Iterable[str] | None = None, team: str | None = None,
             experiment: str | None = None, after_id: int = 0, limit: int | None = None,
             finished_limit: int | None = None, newest: bool = False,
             user: str | None = None) -> list[JobInfo]:
        """Jobs, oldest first, optionally filtered by state (any case), team, experiment, the
        user who submitted them; a page
        of at most `limit` (up to 1000) jobs with ids above `after_id`; with `finished_limit`,
        every job not finished but only that many of the newest finished ones; with `newest`,
        the running ones first, then the newest (the first page `onepool status` shows). A member sees
        its own team's jobs only. Raises SpecError for a state or team that does not exist
        (naming the allowed values) or a bad page, Forbidden (another team)."""
        states = check_filters(status, team, [t.name for t in self.config().teams]
                               if team is not None else None)
        if not 0 <= after_id <= MAX_ID:
            raise SpecError("list", [f"after_id: must be between 0 and {MAX_ID} (got {after_id})"])
        if limit is not None and not 1 <= limit <= MAX_PAGE:
            raise SpecError("list", [f"limit: must be between 1 and {MAX_PAGE} (got {limit})"])
        team = self._team_scope(team, "listing jobs of team")
        check_user(user, "list")
        with self.store.session() as s:
            q = select(Job).where(col(Job.id) > after_id).order_by(
                *((col(Job.state) == JobState.RUNNING).desc(), col(Job.id).desc()) if newest
                else (col(Job.id),))
            if states:
                q = q.where(col(Job.state).in_(states))
            if finished_limit is not None:
                recent = select(Job.id).where(col(Job.state).in_(FINAL)).order_by(
                    col(Job.id).desc()).limit(finished_limit)
                if team:
                    recent = recent.where(Job.team == team)
                if experiment:
                    recent = recent.where(Job.experiment == experiment)
                if user:
                    recent = recent.where(Job.user == user)
                q = q.where(or_(col(Job.state).not_in(FINAL), col(Job.id).in_(recent)))
            if team:
                q = q.where(Job.team == team)
            if experiment:
                q = q.where(Job.experiment == experiment)
            if user:
                q = q.where(Job.user == user)
            if limit is not None:
                q = q.limit(limit)
            jobs = s.exec(q).all()
            by_job: dict[int, list[Attempt]] = {}
            ids = [j.id for j in jobs if j.id is not None]
            if ids:
                for a in s.exec(select(Attempt).where(col(Attempt.job_id).in_(ids))).all():
                    by_job.setdefault(a.job_id, []).append(a)
            now = self.clock.now()
            stores, caused = stores_of(s, ids), telemetry.caused_lost_gpu_s(s, ids)
            return [JobInfo.of(j, by_job.get(j.id or 0, []), now, stores=stores.get(j.id or 0),
                               caused_lost_gpu_s=caused.get(j.id or 0, 0.0)) for j in jobs]

    def _team_scope(self, team: str | None, what: str) -> str | None:
        """The team a read is limited to: `team` if this principal may read it (Forbidden
        otherwise), else the member's own team; None (every team) for an admin."""
        if team is not None:
            self.principal.require_team(team, what)
            return team
        return None if self.principal.is_admin else self.principal.team

    def counts(self, team: str | None = None) -> dict[str, int]:
        """How many jobs are in each state (one GROUP BY): all the caller may see, or `team`'s.
        Raises SpecError for a team that does not exist, Forbidden (another team)."""
        check_filters(None, team, [t.name for t in self.config().teams] if team is not None else None)
        team = self._team_scope(team, "counting jobs of team")
        with self.store.session() as s:
            q = select(Job.state, func.count()).group_by(col(Job.state))
            if team:
                q = q.where(Job.team == team)
            return {str(st): int(n) for st, n in s.exec(q).all()}

    def cancel(self, job_id: int) -> JobInfo:
        """Cancel a job. A pending job (or one stopped by its budget: nothing runs) is CANCELLED
        here and now; a running one is asked to stop (the broker sends SIGTERM, waits the grace
        period, then kills) and ends CANCELLED.

        Raises NotFound (also another team's job), or InvalidState if the job already ended.
        """
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            j = self._job(s, job_id)
            access.require(self.principal, access.Action.CHANGE, f"cancelling job {job_id}", j.team,
                           j.user, job_id)
            if j.state in FINAL:
                raise InvalidState(f"job {job_id} already ended ({j.state}); nothing to cancel")
            # Pending: only if it is still pending when written (the broker may be starting it
            # right now; then it is stopped like a running job, by the flag below).
            if j.state == JobState.PENDING and s.execute(
                    update(Job).where(col(Job.id) == job_id, col(Job.state) == JobState.PENDING)
                    .values(state=JobState.CANCELLED, end_time=now, cancel_requested=True,
                            waiting_reason=None).execution_options(synchronize_session=False)
            ).rowcount:  # type: ignore[attr-defined]
                record(s, now, "cancelled", "cancelled while pending", job_id=job_id)
                info = self._after(s, job_id)
                self.store.changed()
                return info
            if j.state == JobState.BUDGET_EXHAUSTED:
                j.state, j.end_time, j.cancel_requested = JobState.CANCELLED, now, True
                s.add(j)
                record(s, now, "cancelled", "cancelled while stopped by its budget", job_id=job_id)
            elif not j.cancel_requested:
                j.cancel_requested = True
                s.add(j)
                record(s, now, "cancel_requested", "cancel requested: the broker stops it (SIGTERM, "
                       "then its grace period)", job_id=job_id)
        self.store.changed()
        return self.get(job_id)

    def _after(self, s: Session, job_id: int) -> JobInfo:
        s.commit()
        return self.get(job_id)

    def events(self, job_id: int | None = None, user: str | None = None) -> list[EventInfo]:
        """The event log, oldest first: of one job, or every event the caller may see (a
        member: its team's jobs), or only those of the jobs `user` submitted. Raises NotFound
        (also another team's job), SpecError (a bad user name)."""
        check_user(user, "events")
        if user is not None and job_id is not None:
            raise SpecError("events", ["user: give a job id or a user, not both"])
        with self.store.session() as s:
            q = select(Event).order_by(col(Event.id))
            if job_id is not None:
                self._job(s, job_id)
                q = q.where(Event.job_id == job_id)
            elif not self.principal.is_admin or user:
                q = q.join(Job, col(Job.id) == Event.job_id)
                if not self.principal.is_admin:
                    q = q.where(Job.team == self.principal.team)
            if user:
                q = q.where(Job.user == user)
            return [EventInfo.of(e) for e in s.exec(q).all()]

    def logs(self, job_id: int, attempt: int | None = None, rank: int = 0,
             offset: int = 0) -> LogChunk:
        """Output of one rank of one attempt (default: the job's newest), from byte `offset`,
        at most 1 MiB per call; `next_offset` continues it. Output over the attempt's cap
        (broker.output_cap_bytes) was dropped, the tail kept: the chunk starts at the next byte
        kept, and `dropped` counts what is gone. Raises NotFound (no such job,
        attempt or rank; not started), SpecError (an offset or rank out of range)."""
        if not (0 <= offset <= MAX_LOG_OFFSET and 0 <= rank <= 4096):
            raise SpecError("logs", [f"offset and rank: must be between 0 and {MAX_LOG_OFFSET} (16 TiB) "
                                     f"and 0 and 4096 (got {offset}, {rank})"])
        with self.store.session() as s:
            j = self._job(s, job_id)
            atts = list(s.exec(select(Attempt).where(Attempt.job_id == job_id)
                               .order_by(col(Attempt.number))).all())
            status = j.state
        if not atts:
            raise NotFound(f"job {job_id} has not started yet ({status})")
        a = atts[-1] if attempt is None else next((x for x in atts if x.number == attempt), None)
        if a is None:
            raise NotFound(f"job {job_id} has no attempt {attempt} (it has {len(atts)})")
        if rank >= len(a.alloc):
            raise NotFound(f"job {job_id} attempt {a.number} has ranks 0..{len(a.alloc) - 1}")
        run_dir = self.store.home / "runs" / f"attempt-{a.id}" / f"rank-{rank}"
        start, raw = output_log.read(run_dir, offset, LOG_CHUNK)
        return LogChunk(job_id=job_id, attempt=a.number, attempts=len(atts), rank=rank,
                        offset=start, next_offset=start + len(raw),
                        data=raw.decode("utf-8", errors="replace"),
                        attempt_ended=a.ended_at is not None, job_status=status,
                        dropped=output_log.extent(run_dir).dropped)

    # -- health (issue 10) -------------------------------------------------------------------
    def health(self) -> Health:
        """Whether a broker leads and cycles on this database now (broker.control.health)."""
        with self.store.session() as s:
            return broker_health(s, self.clock.now())

    def wait(self, job_ids: Iterable[int], timeout: float = 3600.0,
             poll_s: float = 0.2) -> list[JobInfo]:
        """Block until every job has ended (or stopped as BUDGET_EXHAUSTED). Raises
        TimeoutError naming the ones still open."""
        return wait_stopped(self.get, job_ids, timeout, poll_s)


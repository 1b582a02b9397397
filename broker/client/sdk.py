"""The Python SDK: submit, inspect, cancel and wait for jobs.

    from broker.sdk import Client
    c = Client()                                   # $ONEPOOL_HOME or ./.onepool
    job = c.submit(name="bert", team="nlp", command=["python", "train.py"],
                   gpus_per_node=2, priority="high", budget_usd=40)
    c.wait([job.id])

The client writes to the same database the broker reads; the broker picks new jobs up on
its next cycle. Every method raises SpecError (bad input), NotFound, InvalidState or
NotConfigured with a message that says what to fix.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, or_, select

from broker.checkpoint import telemetry
from broker.checkpoint.checkpoints import job_prefix
from broker.checkpoint.index import default_store_root, stores_of
from broker.client.filters import check_filters
from broker.clock import Clock, SystemClock
from broker.control import budgets as budget_rules
from broker.control.config_apply import applied_config, apply_config
from broker.errors import InvalidState, NotFound, SpecError
from broker.spec import ClusterConfig, JobSpec, check_job_fits, load_config, parse_job
from broker.state import costs as cost_queries
from broker.state.events import record
from broker.state.model import Attempt, Event, Job, JobState
from broker.state.store import Store
from broker.state.views import EventInfo, JobInfo, LostWorkRow, PoolInfo

FINAL = {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value}
STOPPED = FINAL | {JobState.BUDGET_EXHAUSTED.value}  # what wait() returns on


class Client:
    def __init__(self, home: str | os.PathLike[str] | None = None, *, url: str | None = None,
                 clock: Clock | None = None, store: Store | None = None) -> None:
        self.store = store or Store(home, url)
        self.clock = clock or SystemClock()

    # -- configuration ----------------------------------------------------------------------
    def apply(self, config: ClusterConfig | str | Path) -> ClusterConfig:
        """Apply an onepool.yaml (path or parsed). Raises SpecError for bad content."""
        cfg = config if isinstance(config, ClusterConfig) else load_config(config)
        with self.store.session() as s:
            apply_config(s, cfg)
        return cfg

    def config(self) -> ClusterConfig:
        with self.store.session() as s:
            return applied_config(s)

    def checkpoint_root(self, cfg: ClusterConfig) -> str:
        return default_store_root(cfg, self.store.home)

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec | dict[str, Any] | None = None, /, *,
               priority: str | None = None, budget_usd: float | None = None,
               **fields: Any) -> JobInfo:
        """Queue a job. `spec` (a JobSpec or dict) and keyword fields are merged, keywords win.

        Raises SpecError naming the bad field and the allowed values (unknown team, GPU type
        no pool has, a shape no pool can hold, ...). Nothing is written on error.
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
        cfg = self.config()
        js = parse_job(data)
        check_job_fits(js, cfg)
        now = self.clock.now()
        with self.store.session() as s:
            js, budget_note = budget_rules.check_submission(s, cfg, js, now)  # money (issue 6)
            job = Job(name=js.name, experiment=js.experiment, team=js.team, command=js.command,
                      env=js.env, workdir=js.workdir or os.getcwd(),
                      gpus_per_node=js.gpus_per_node, nodes=js.nodes, gpu_types=js.gpu_types,
                      priority=js.priority.value, budget_usd=js.budget_usd, spot=js.spot.value,
                      checkpoint_interval_s=js.checkpoint_interval_s,
                      expected_duration_s=js.expected_duration_s, submit_time=now, queued_at=now)
            s.add(job)
            s.flush()
            assert job.id is not None
            job.checkpoint_uri = job_prefix(self.checkpoint_root(cfg), js.team, js.experiment, job.id)
            record(s, now, "submitted", f"{js.priority.value} job, {js.nodes}x{js.gpus_per_node} "
                   f"GPUs, team {js.team}", job_id=job.id)
            if budget_note:
                record(s, now, "budget_spot_only", budget_note, job_id=job.id)
            s.add(job)
        return self.get(job.id)

    def get(self, job_id: int) -> JobInfo:
        """The job with its attempts. Raises NotFound."""
        with self.store.session() as s:
            j = s.get(Job, job_id)
            if j is None:
                raise NotFound(f"no job with id {job_id}")
            atts = list(s.exec(select(Attempt).where(Attempt.job_id == job_id)).all())
            return JobInfo.of(j, atts, self.clock.now(), stores=stores_of(s, [job_id]).get(job_id),
                              caused_lost_gpu_s=telemetry.caused_lost_gpu_s(s, [job_id]).get(job_id, 0.0))

    def list(self, *, status: Iterable[str] | None = None, team: str | None = None,
             experiment: str | None = None, finished_limit: int | None = None) -> list[JobInfo]:
        """Jobs, oldest first, optionally filtered by state (any case), team, experiment; with
        `finished_limit`, every job not finished but only that many of the newest finished ones.
        Raises SpecError for a state or team that does not exist, naming the allowed values."""
        states = check_filters(status, team, [t.name for t in self.config().teams]
                               if team is not None else None)
        with self.store.session() as s:
            q = select(Job).order_by(Job.id)
            if states:
                q = q.where(col(Job.state).in_(states))
            if finished_limit is not None:
                newest = select(Job.id).where(col(Job.state).in_(FINAL)).order_by(
                    col(Job.id).desc()).limit(finished_limit)
                if team:
                    newest = newest.where(Job.team == team)
                if experiment:
                    newest = newest.where(Job.experiment == experiment)
                q = q.where(or_(col(Job.state).not_in(FINAL), col(Job.id).in_(newest)))
            if team:
                q = q.where(Job.team == team)
            if experiment:
                q = q.where(Job.experiment == experiment)
            jobs = s.exec(q).all()
            by_job: dict[int, list[Attempt]] = {}
            ids = [j.id for j in jobs]
            if ids:
                for a in s.exec(select(Attempt).where(col(Attempt.job_id).in_(ids))).all():
                    by_job.setdefault(a.job_id, []).append(a)
            now = self.clock.now()
            stores, caused = stores_of(s, ids), telemetry.caused_lost_gpu_s(s, ids)
            return [JobInfo.of(j, by_job.get(j.id or 0, []), now, stores=stores.get(j.id or 0),
                               caused_lost_gpu_s=caused.get(j.id or 0, 0.0)) for j in jobs]

    def cancel(self, job_id: int) -> JobInfo:
        """Cancel a job. A pending job (or one stopped by its budget: nothing runs) is CANCELLED
        here and now; a running one is asked to stop (the broker sends SIGTERM, waits the grace
        period, then kills) and ends CANCELLED.

        Raises NotFound, or InvalidState if the job already ended.
        """
        now = self.clock.now()
        with self.store.session() as s:
            j = s.get(Job, job_id)
            if j is None:
                raise NotFound(f"no job with id {job_id}")
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
                return self._after(s, job_id)
            if j.state == JobState.BUDGET_EXHAUSTED:
                j.state, j.end_time, j.cancel_requested = JobState.CANCELLED, now, True
                s.add(j)
                record(s, now, "cancelled", "cancelled while stopped by its budget", job_id=job_id)
            elif not j.cancel_requested:
                j.cancel_requested = True
                s.add(j)
                record(s, now, "cancel_requested", "cancel requested: the broker stops it (SIGTERM, "
                       "then its grace period)", job_id=job_id)
        return self.get(job_id)

    def _after(self, s: Session, job_id: int) -> JobInfo:
        s.commit()
        return self.get(job_id)

    def events(self, job_id: int | None = None) -> list[EventInfo]:
        with self.store.session() as s:
            q = select(Event).order_by(Event.id)
            if job_id is not None:
                if s.get(Job, job_id) is None:
                    raise NotFound(f"no job with id {job_id}")
                q = q.where(Event.job_id == job_id)
            return [EventInfo.of(e) for e in s.exec(q).all()]

    def lost_work(self, by: telemetry.By = "team") -> list[LostWorkRow]:
        """Lost GPU-hours, most first: by="team"/"job" charges preemptions to the preempting
        team/job; by="cause" groups every interruption by its cause. Raises ValueError for
        another `by`."""
        with self.store.session() as s:
            return telemetry.lost_work(s, by)

    # -- money (issue 6) ----------------------------------------------------------------------
    def costs(self, by: cost_queries.CostBy = "experiment", since: float | None = None,
              until: float | None = None) -> list[cost_queries.CostRow]:
        """USD, GPU-hours and lost work per experiment, team, job, pool, market or UTC day (see
        broker.state.costs: every view sums to the same total). Raises ValueError for another `by`."""
        with self.store.session() as s:
            return cost_queries.costs(s, by, since, until)

    def set_budget(self, amount_usd: float, *, job_id: int | None = None,
                   team: str | None = None) -> str:
        """Set a job's budget (a BUDGET_EXHAUSTED job resumes) or override a team's window
        budget. Give exactly one of job_id, team. Returns what happened."""
        if (job_id is None) == (team is None):
            raise SpecError("budget", ["give a job id or a team (exactly one)"])
        now = self.clock.now()
        with self.store.session() as s:
            if job_id is not None:
                return budget_rules.set_job_budget(s, job_id, amount_usd, now)
            return budget_rules.set_team_budget(s, applied_config(s), team or "", amount_usd, now)

    def pools(self, *, include_inactive: bool = False) -> list[PoolInfo]:
        """Every pool now: market, the price in force (USD per node-hour, and per GPU-hour as
        charged), its live nodes with their free GPUs, the jobs holding the rest, their age."""
        from broker.state import inventory

        with self.store.session() as s:
            return inventory.pools(s, applied_config(s), self.clock.now(),
                                   include_inactive=include_inactive)

    def budgets(self) -> list[budget_rules.TeamBudget]:
        """Every team's window budget now: amount, spent, state (none/ok/low/exhausted)."""
        with self.store.session() as s:
            return budget_rules.team_budgets(s, applied_config(s), self.clock.now())

    def wait(self, job_ids: Iterable[int], timeout: float = 3600.0,
             poll_s: float = 0.2) -> list[JobInfo]:
        """Block until every job has ended (or stopped as BUDGET_EXHAUSTED). Raises TimeoutError
        naming the ones still open.

        Polls the database (the broker may be another process): a wall-clock wait.
        """
        ids = list(job_ids)
        deadline = time.monotonic() + timeout
        while True:
            infos = [self.get(i) for i in ids]
            if all(i.status in STOPPED for i in infos):
                return infos
            if time.monotonic() > deadline:
                open_ = [f"{i.id} ({i.status})" for i in infos if i.status not in STOPPED]
                raise TimeoutError(f"jobs still not finished after {timeout:g}s: {', '.join(open_)}")
            time.sleep(poll_s)

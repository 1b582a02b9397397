"""SDK methods that change a job after its submit (issue 28): `update` (priority, budget),
`hold`, `release`. Mixed into broker.client.sdk.Client (which provides `store`, `clock`,
`principal` and `_job`).

Contract:

- Who may: the CHANGE rule of broker.state.access (the job's submitter, a token of its whole
  team, its team lead, an admin); another team's job is NotFound.
- Same rules as submit: a new priority must be a priority class; with any change, the job's
  team must not have spent its budget, and a new budget must cover the job's estimate (or it is
  queued spot-only, as a submit would be; broker.control.budgets.check_submission) and what the
  job already spent. A BUDGET_EXHAUSTED job given room resumes from its checkpoint. Quotas
  (issue 28 part 1) plug in at `QUOTA_CHECKS`.
- A running job keeps the class it was placed with until its next placement (a preemption or
  a resume): a raise cannot bypass the urgent allowance, which is counted at placement.
- hold: a PENDING job (or one stopped by its budget) stays in the queue but is never placed;
  its "why waiting" says who held it. A RUNNING job is refused (InvalidState): cancel it, or
  hold it once it waits again; onepool does not stop running work for a hold. release: it
  competes again, with its place in the queue (its submit time) unchanged. Both are
  idempotent on a job in that state already.
- Each change is one transaction with an event naming its actor (`priority_changed`,
  `budget_set`, `held`, `released`), and wakes the broker (Store.changed()).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlmodel import Session

from broker.client.waits import FINAL
from broker.control import budgets as budget_rules
from broker.control.config_apply import applied_config
from broker.control.holds import hold_reason
from broker.errors import InvalidState, SpecError
from broker.spec import ClusterConfig, JobSpec, SpotPolicy
from broker.spec_types import Priority
from broker.state.access import Action, require
from broker.state.events import acting_as, record
from broker.state.model import Job, JobState

if TYPE_CHECKING:
    from broker.clock import Clock
    from broker.state.store import Store
    from broker.state.tokens import Principal
    from broker.wire import JobInfo

# Checks a change must pass besides the budget: (session, config, the job, its spec as changed).
# Each raises (BudgetError, Forbidden, SpecError...) to refuse. Quotas (issue 28 part 1, branch
# quotas) append theirs here.
QUOTA_CHECKS: list[Callable[[Session, ClusterConfig, Job, JobSpec], None]] = []
PRIORITIES = [p.value for p in Priority]


def spec_of(j: Job) -> JobSpec:
    """The fields of `j` the submit rules read, as a JobSpec (not validated again: they were at
    submit)."""
    return JobSpec.model_construct(
        name=j.name, team=j.team, command=list(j.command), experiment=j.experiment,
        gpus_per_node=j.gpus_per_node, nodes=j.nodes, gpu_types=list(j.gpu_types),
        priority=Priority(j.priority), budget_usd=j.budget_usd, spot=SpotPolicy(j.spot),
        expected_duration_s=j.expected_duration_s, checkpoint_interval_s=j.checkpoint_interval_s)


def check_update(priority: str | None, budget_usd: float | None) -> None:
    """Raises SpecError naming the field and its allowed values."""
    problems = []
    if priority is None and budget_usd is None:
        problems.append("(root): give a priority, a budget_usd, or both")
    if priority is not None and priority not in PRIORITIES:
        problems.append(f"priority: must be one of {', '.join(PRIORITIES)} (got {priority!r})")
    if budget_usd is not None and (not math.isfinite(budget_usd) or budget_usd < 0):
        problems.append(f"budget_usd: must be a finite number of USD >= 0 (got {budget_usd})")
    if problems:
        raise SpecError("update", problems)


class ChangesMixin:
    store: Store
    clock: Clock
    principal: Principal

    if TYPE_CHECKING:
        def _job(self, s: Session, job_id: int, what: str = "") -> Job: ...
        def get(self, job_id: int) -> JobInfo: ...

    def _changeable(self, s: Session, job_id: int, what: str) -> Job:
        """The job, if this principal may change it. Raises NotFound (also another team's job),
        Forbidden (a member's token and another person's job), InvalidState (it ended)."""
        j = self._job(s, job_id)
        require(self.principal, Action.CHANGE, what, j.team, j.user, job_id)
        if j.state in FINAL:
            raise InvalidState(f"job {job_id} already ended ({j.state}); nothing to change")
        return j

    def update(self, job_id: int, *, priority: str | None = None,
               budget_usd: float | None = None) -> JobInfo:
        """Change a job's priority and/or budget under the submit's rules (see the module's
        docstring). Raises SpecError, NotFound, Forbidden, InvalidState, BudgetError."""
        check_update(priority, budget_usd)
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            j = self._changeable(s, job_id, f"updating job {job_id}")
            cfg = applied_config(s)
            changes: dict[str, object] = {}
            if priority is not None:
                changes["priority"] = Priority(priority)
            if budget_usd is not None:
                changes["budget_usd"] = budget_usd
            js = spec_of(j).model_copy(update=changes)
            for check in QUOTA_CHECKS:  # [issue 28 quotas hook]
                check(s, cfg, j, js)
            js, note = budget_rules.check_submission(s, cfg, js, now)
            if note is not None and j.spot != js.spot.value:
                j.spot = js.spot.value
                record(s, now, "spot_only", note, job_id=job_id)
            if priority is not None and priority != j.priority:
                old, j.priority = j.priority, priority
                when = (" (it runs in the class it was placed with until its next placement)"
                        if j.state == JobState.RUNNING else "")
                record(s, now, "priority_changed", f"priority {old} -> {priority}{when}",
                       job_id=job_id, old=old, new=priority)
            s.add(j)
            if budget_usd is not None:
                s.flush()
                budget_rules.set_job_budget(s, job_id, budget_usd, now)
        self.store.changed()
        return self.get(job_id)

    def hold(self, job_id: int) -> JobInfo:
        """Keep a waiting job from being placed until release(). Raises NotFound, Forbidden,
        InvalidState (it runs: cancel it, or hold it once it waits again; or it ended)."""
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            j = self._changeable(s, job_id, f"holding job {job_id}")
            if j.state == JobState.RUNNING:
                raise InvalidState(f"job {job_id} is running: a hold keeps waiting jobs from "
                                   f"starting and stops nothing (cancel it with `onepool cancel "
                                   f"{job_id}`, or hold it once it waits again)")
            if j.held_by is None:
                j.held_by = self.principal.actor
                j.waiting_reason = hold_reason(j.held_by, job_id)
                s.add(j)
                record(s, now, "held", f"on hold: never placed until `onepool release {job_id}`",
                       job_id=job_id)
        self.store.changed()
        return self.get(job_id)

    def release(self, job_id: int) -> JobInfo:
        """Let a held job be placed again. Raises NotFound, Forbidden, InvalidState (ended)."""
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            j = self._changeable(s, job_id, f"releasing job {job_id}")
            if j.held_by is not None:
                was, j.held_by, j.waiting_reason = j.held_by, None, None
                s.add(j)
                record(s, now, "released", f"released (held by {was}): it competes for GPUs again",
                       job_id=job_id, held_by=was)
        self.store.changed()
        return self.get(job_id)


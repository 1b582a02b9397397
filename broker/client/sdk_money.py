"""The SDK's reports on work lost and money (issue 6), embedded: lost GPU-hours by cause or by
who preempted whom, costs per experiment, team, job, pool, market or day, budgets (set and
read), and the pools with their prices and free GPUs. A member sees its own team's rows only.
Client (broker.client.sdk) inherits them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sqlmodel import Session, select

from broker.checkpoint import telemetry
from broker.client.sdk_admin import visible_nodes
from broker.control import budgets as budget_rules
from broker.control.config_apply import applied_config
from broker.errors import SpecError
from broker.state import access
from broker.state import costs as cost_queries
from broker.state.events import acting_as
from broker.state.model import Job
from broker.state.views import LostWorkRow, PoolInfo

if TYPE_CHECKING:
    from broker.client.sdk import Client


class MoneyMixin:
    def lost_work(self: Client, by: telemetry.By = "team") -> list[LostWorkRow]:
        """Lost GPU-hours, most first: by="team"/"job"/"user" charges preemptions to the
        preempting team/job/person (`team/user`); by="cause" groups every interruption by its
        cause. A member sees job and user rows of its own team only. Raises SpecError for
        another `by`."""
        if by not in telemetry.LOST_BY:
            raise SpecError("lost", [f"by: must be one of {', '.join(telemetry.LOST_BY)} (got {by!r})"])
        with self.store.session() as s:
            rows = telemetry.lost_work(s, by)
            if self.principal.is_admin:
                return rows
            mine = self._team_job_ids(s)
            if by == "job":
                rows = [r for r in rows if int(r.key) in mine]
            elif by == "user":
                rows = [r for r in rows if r.key.startswith(f"{self.principal.team}/")]
            return [r.model_copy(update={"victims": [v for v in r.victims if v in mine]})
                    for r in rows]

    def _team_job_ids(self: Client, s: Session) -> set[int]:
        return set(s.exec(select(Job.id).where(Job.team == self.principal.team)).all())

    # -- money (issue 6) ----------------------------------------------------------------------
    def costs(self: Client, by: cost_queries.CostBy = "experiment", since: float | None = None,
              until: float | None = None) -> list[cost_queries.CostRow]:
        """USD, GPU-hours and lost work per experiment, team, job, pool, market or UTC day (see
        broker.state.costs: every view sums to the same total). A member sees experiment and
        job rows of its own team only. Raises SpecError for another `by`."""
        if by not in cost_queries.COST_BY:
            raise SpecError("cost", [f"by: must be one of {', '.join(cost_queries.COST_BY)} "
                                     f"(got {by!r})"])
        with self.store.session() as s:
            rows = cost_queries.costs(s, by, since, until)
            if self.principal.is_admin or by in ("team", "pool", "market", "day"):
                return rows
            jobs = s.exec(select(Job.id, Job.experiment).where(Job.team == self.principal.team)).all()
            keys = ({str(i) for i, _ in jobs} if by == "job" else
                    set(cost_queries.user_keys(s, self.principal.team).values()) if by == "user"
                    else {e for _, e in jobs})
            return [r for r in rows if r.key in keys]

    def set_budget(self: Client, amount_usd: float, *, job_id: int | None = None,
                   team: str | None = None) -> str:
        """Set a job's budget (a BUDGET_EXHAUSTED job resumes) or override a team's window
        budget. Give exactly one of job_id, team. A job's: its team lead or an admin (its
        submitter: update(budget_usd=...), under the submit's rules); a team's: admins. Returns
        what happened."""
        if team is not None or job_id is None:
            self.principal.require_admin("changing a team's budget")
        if (job_id is None) == (team is None):
            raise SpecError("budget", ["give a job id or a team (exactly one)"])
        if not math.isfinite(amount_usd) or amount_usd < 0:
            raise SpecError("budget", [f"amount: must be a finite number of USD >= 0 (got {amount_usd})"])
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            if job_id is not None:
                j = self._job(s, job_id)
                access.require(self.principal, access.Action.JOB_BUDGET, f"setting job {job_id}'s "
                               "budget", j.team, j.user, job_id)
                said = budget_rules.set_job_budget(s, job_id, amount_usd, now)
            else:
                said = budget_rules.set_team_budget(s, applied_config(s), team or "", amount_usd, now)
        self.store.changed()
        return said

    def pools(self: Client, *, include_inactive: bool = False) -> list[PoolInfo]:
        """Every pool now: market, the price in force (USD per node-hour, and per GPU-hour as
        charged), its live nodes with their free GPUs, the jobs holding the rest (a member: its
        own team's only), their age."""
        from broker.state import inventory

        with self.store.session() as s:
            pools = inventory.pools(s, applied_config(s), self.clock.now(),
                                    include_inactive=include_inactive)
            if self.principal.is_admin:
                return pools
            return [p.model_copy(update={"nodes": visible_nodes(s, self.principal, p.nodes)}) for p in pools]

    def budgets(self: Client) -> list[budget_rules.TeamBudget]:
        """Every team's window budget now (a member: its own team's): amount, spent, state."""
        with self.store.session() as s:
            rows = budget_rules.team_budgets(s, applied_config(s), self.clock.now())
        return rows if self.principal.is_admin else [b for b in rows if b.team == self.principal.team]

"""The dashboard's reads on the database, as one principal may see them: what the API's
/v1/dashboard routes serve (broker.api.routes_dashboard) and what the embedded dashboard reads
directly. The rule is the SDK's: an admin (and the embedded local user) sees every team; a
member sees its own team's jobs, attempts, logs, events and money, and of the cluster only its
capacity (pools, nodes and free GPUs, other teams' job ids hidden: broker.client.sdk)."""

from __future__ import annotations

from broker.client.sdk import Client
from broker.errors import NotFound
from broker.state.ledger import spend_by_job
from dashboard import queries
from dashboard.wire import JobDetail, LogTail, Rows, Snapshot

JOB_PAGE_FINISHED = 200  # the job page offers every unfinished job and this many finished ones
MAX_HOURS = 24 * 90


def viewer(client: Client) -> str:
    """Who looks, in words, for the page's sidebar."""
    p = client.principal
    return "local user (every team)" if p.kind == "local" else f"{p.kind} of team {p.team}"


class LocalData:
    """Reads as `client.principal` (the request's token on the server)."""

    def __init__(self, client: Client) -> None:
        self.c = client

    @property
    def team(self) -> str | None:
        """Whose data this principal sees: None for every team."""
        p = self.c.principal
        return None if p.is_admin else p.team

    def snapshot(self, hours: float) -> Snapshot:
        """Every tab's data over at most the last `hours` (1 to 90 days' worth)."""
        now, team = self.c.clock.now(), self.team
        pools = self.c.pools()
        costs, by_user = self.c.costs("experiment"), self.c.costs("user")
        jobs = self.c.list(finished_limit=JOB_PAGE_FINISHED)
        with self.c.store.session() as s:
            lo, hi = queries.time_range(s, now, min(max(hours, 1.0), MAX_HOURS) * 3600.0, team)
            budgets = queries.budget_overview(s, now, team=team)
            return Snapshot(
                now=now, viewer=viewer(self.c), team=team, since=lo,
                overview={**queries.now_overview(s, now, team), "free_gpus": sum(p.free_gpus for p in pools)},
                usage=queries.gpus_in_use(s, lo, hi, team), queue=queries.queue_length(s, lo, hi, team),
                pools=pools, costs=costs, costs_by_user=by_user, jobs=jobs,
                interruptions=queries.interruptions(s, team=team),
                budgets=budgets,
                burndowns={r["team"]: queries.burndown(s, r["team"], now) for r in budgets
                           if r["budget_usd"] is not None},
                rebalancing=queries.rebalance_moves(s, team=team))

    def experiment_jobs(self, experiment: str) -> Rows:
        """The jobs of one experiment (a member: its team's) with what each cost."""
        with self.c.store.session() as s:
            return queries.experiment_jobs(s, experiment, self.team)

    def job(self, job_id: int) -> JobDetail:
        """One job's attempts, events and spend. Raises NotFound (also another team's job)."""
        self.c.get(job_id)
        with self.c.store.session() as s:
            return JobDetail(attempts=queries.job_attempts(s, job_id), events=queries.job_events(s, job_id),
                             spent_usd=spend_by_job(s, [job_id]).get(job_id, 0.0))

    def log_tail(self, job_id: int, attempt: int) -> LogTail:
        """The end of attempt number `attempt`'s output (rank 0). Raises NotFound (no such job,
        another team's, or no such attempt)."""
        rows = self.job(job_id).attempts
        a = next((r for r in rows if r["attempt"] == attempt), None)
        if a is None:
            raise NotFound(f"job {job_id} has no attempt {attempt} (it has {len(rows)})")
        return LogTail(text=queries.log_tail(self.c.store.home, a["id"]))

"""What the dashboard reads, as the API sends it (GET /v1/dashboard...): plain pydantic over
broker.wire, importing nothing of the server, so the dashboard runs on any machine that
reaches the server with only the thin client and Streamlit installed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from broker.wire import CostRow, JobInfo, PoolInfo

Rows = list[dict[str, Any]]


class Snapshot(BaseModel):
    """Every tab's data at `now` but the drill-downs, as `viewer` may see it: `team` None is
    every team (an admin, the embedded single user), else that team's jobs and money only.
    Row shapes are dashboard.queries'."""

    now: float
    viewer: str  # who looks, in words: "admin of team research", "member of team prod", ...
    team: str | None
    since: float  # the charts' span: since .. now
    overview: dict[str, Any]
    usage: Rows
    queue: Rows
    pools: list[PoolInfo]
    costs: list[CostRow]  # by experiment
    costs_by_user: list[CostRow] = []  # by person: `team/user` (issue 28)
    jobs: list[JobInfo]  # every unfinished job and the newest finished ones
    interruptions: Rows
    budgets: Rows
    burndowns: dict[str, Rows]
    rebalancing: Rows


class JobDetail(BaseModel):
    """One job's attempts (with what each cost), its newest events and its spend."""

    attempts: Rows
    events: Rows
    spent_usd: float


class LogTail(BaseModel):
    text: str | None  # None: that attempt has no output here

"""/v1/dashboard routes: what the dashboard shows, read as the token's principal (a member: its
own team's jobs and money; an admin: everything), so the dashboard can run on any machine
that reaches the server (dashboard.remote). Each is one read of dashboard.data.LocalData."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from broker.api.context import client
from broker.client.sdk import Client
from broker.spec import MAX_ID
from dashboard.data import MAX_HOURS, LocalData
from dashboard.wire import JobDetail, LogTail, Snapshot

router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"])
ClientDep = Annotated[Client, Depends(client)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]


@router.get("", response_model=Snapshot)
def snapshot(c: ClientDep, hours: Annotated[float, Query(ge=1, le=MAX_HOURS, allow_inf_nan=False)] = 24
             ) -> Snapshot:
    """Every tab's data now; charts over at most the last `hours`."""
    return LocalData(c).snapshot(hours)


@router.get("/experiments/{experiment}/jobs")
def experiment_jobs(c: ClientDep, experiment: Annotated[str, Path(max_length=200)]) -> list[dict[str, Any]]:
    """The jobs of one experiment with what each cost (a member: its team's only)."""
    return LocalData(c).experiment_jobs(experiment)


@router.get("/jobs/{job_id}", response_model=JobDetail)
def job(c: ClientDep, job_id: JobId) -> JobDetail:
    """One job's attempts, events and spend."""
    return LocalData(c).job(job_id)


@router.get("/jobs/{job_id}/tail", response_model=LogTail)
def tail(c: ClientDep, job_id: JobId, attempt: Annotated[int, Query(ge=1, le=MAX_ID)]) -> LogTail:
    """The end of an attempt's output (rank 0, at most 8 KiB)."""
    return LocalData(c).log_tail(job_id, attempt)

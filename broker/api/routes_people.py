"""/v1 routes that change a job after its submit (issue 28): update its priority or budget,
hold and release it. Each is one SDK call made as the token's principal, so who may is the
SDK's rule (broker.state.access) and the same in both modes (broker.client.sdk_changes)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, Field

from broker.api.context import client
from broker.client.sdk import Client
from broker.spec import MAX_ID
from broker.wire import JobInfo

router = APIRouter(prefix="/v1", tags=["jobs"])
ClientDep = Annotated[Client, Depends(client)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]


class JobUpdate(BaseModel):
    """What to change: either field or both (validated by the SDK, with the same messages in
    both modes)."""

    priority: str | None = Field(default=None, max_length=16, description="urgent|high|normal|low")
    budget_usd: float | None = Field(default=None, description="USD, finite, >= 0")


@router.patch("/jobs/{job_id}", response_model=JobInfo)
def update(c: ClientDep, job_id: JobId, body: JobUpdate) -> JobInfo:
    """Change a job's priority and/or budget under the submit's rules (`onepool update`)."""
    return c.update(job_id, priority=body.priority, budget_usd=body.budget_usd)


@router.post("/jobs/{job_id}/hold", response_model=JobInfo)
def hold(c: ClientDep, job_id: JobId) -> JobInfo:
    """Keep a waiting job from being placed until it is released (a running job: 409)."""
    return c.hold(job_id)


@router.post("/jobs/{job_id}/release", response_model=JobInfo)
def release(c: ClientDep, job_id: JobId) -> JobInfo:
    """Let a held job be placed again."""
    return c.release(job_id)

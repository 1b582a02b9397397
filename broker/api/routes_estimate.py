"""/v1 routes for estimates (issue 29): when a job would start and what it would cost, before
submitting it or while it waits. Each is one SDK call as the token's principal
(broker.client.sdk_estimate); nothing is written."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query

from broker.api.context import client
from broker.client.estimate_info import MAX_ESTIMATES, EstimateInfo
from broker.client.sdk import MAX_ID, Client
from broker.errors import SpecError

router = APIRouter(prefix="/v1")
ClientDep = Annotated[Client, Depends(client)]


@router.post("/estimate", response_model=EstimateInfo, tags=["jobs"])
def estimate(c: ClientDep, body: Annotated[Any, Body()] = None) -> EstimateInfo:
    """The pool, start (p10/p50/p90) and cost a job spec would get if submitted now."""
    if not isinstance(body, dict):
        raise SpecError("job", ["(root): must be a mapping of job fields"])
    return c.estimate(body)


@router.get("/estimates", response_model=list[EstimateInfo], tags=["jobs"])
def estimates(c: ClientDep, job_id: Annotated[list[int], Query(max_length=MAX_ESTIMATES)],
              ) -> list[EstimateInfo]:
    """The estimates of pending jobs (held or not pending ones are left out)."""
    if any(not 1 <= j <= MAX_ID for j in job_id):
        raise SpecError("job_id", [f"must be 1 to {MAX_ID}"])
    return c.estimates(job_id)

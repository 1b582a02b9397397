"""/v1 routes for jobs, money and lost work: each is one SDK call made as the token's
principal, so the rules of who may do what are the SDK's (broker.client.sdk)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from broker.api.context import bearer, client, ctx, verify
from broker.api.guard import authenticated
from broker.client.sdk import MAX_PAGE, Client
from broker.errors import OnepoolError, TooManyRequests, Unauthorized
from broker.spec import MAX_ID, MAX_LOG_OFFSET, JobSpec
from broker.state.tokens import NotVerifiedHere
from broker.wire import CostRow, EventInfo, JobInfo, LogChunk, LostWorkRow, TeamBudget

router = APIRouter(prefix="/v1")
ClientDep = Annotated[Client, Depends(client)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]
Count = Annotated[int, Query(ge=0, le=MAX_ID)]


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `{"$ref": "#/$defs/NAME"}` replaced by that definition (JobSpec's
    enums: Priority, SpotPolicy), so the request body's schema stands alone in the OpenAPI
    document instead of naming components it does not define."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline({**defs[ref.removeprefix("#/$defs/")],
                            **{k: v for k, v in node.items() if k != "$ref"}}, defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _job_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema()
    schema = _inline(schema, schema.pop("$defs", {}))
    schema["required"] = [r for r in schema.get("required", []) if r != "team"]
    schema["description"] = ("The job spec (see `onepool submit --help`); `team` defaults to "
                             "the token's team.")
    return schema


class JobPage(BaseModel):
    jobs: list[JobInfo]
    next_after_id: int | None = Field(description="pass as after_id for the next page; null: no more")


class BudgetBody(BaseModel):
    usd: float  # validated by the SDK (finite, >= 0), with the same message in both modes


class Message(BaseModel):
    message: str


@router.post("/jobs", status_code=201, response_model=JobInfo, tags=["jobs"],
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": _job_schema()}}}})
async def submit(request: Request, body: Annotated[Any, Body()] = None,
                 idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> Response:
    """Queue a job. With an `Idempotency-Key` header, a retry returns the first job."""
    c, token = ctx(request), bearer(request)
    try:
        try:
            info = await c.batcher.submit(token, body, idempotency_key)
        except NotVerifiedHere:  # an old, slow hash: check it (and upgrade it) off the loop
            await run_in_threadpool(verify, c, token)
            info = await c.batcher.submit(token, body, idempotency_key)
    except (Unauthorized, TooManyRequests):
        raise
    except OnepoolError:  # refused after its token passed (spec, team, budget...)
        authenticated(request.scope)
        raise
    authenticated(request.scope)
    # The JobInfo the response model documents, serialized once (not validated again).
    return Response(info.model_dump_json(), status_code=201, media_type="application/json")


@router.get("/jobs", response_model=JobPage, tags=["jobs"])
def list_jobs(c: ClientDep, status: Annotated[list[str] | None, Query()] = None,
              team: str | None = None, experiment: str | None = None,
              after_id: Count = 0,
              limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
              finished_limit: Annotated[int | None, Query(ge=0, le=MAX_PAGE)] = None,
              newest: bool = False, user: Annotated[str | None, Query(max_length=63)] = None) -> JobPage:
    """Jobs, oldest first, a page at a time (a member: its team's only); with finished_limit,
    every job not finished but only that many of the newest finished ones; with newest, one
    page of the running jobs first, then the newest (`onepool status`; next_after_id is null)."""
    jobs = c.list(status=status, team=team, experiment=experiment, after_id=after_id, limit=limit,
                  finished_limit=finished_limit, newest=newest, user=user)
    more = len(jobs) == limit and not newest
    return JobPage(jobs=jobs, next_after_id=jobs[-1].id if more else None)


@router.get("/jobs/counts", response_model=dict[str, int], tags=["jobs"])
def job_counts(c: ClientDep, team: str | None = None) -> dict[str, int]:
    """How many jobs are in each state (one GROUP BY; a member: its team's only)."""
    return c.counts(team)


@router.get("/jobs/{job_id}", response_model=JobInfo, tags=["jobs"])
def get_job(c: ClientDep, job_id: JobId) -> JobInfo:
    return c.get(job_id)


@router.post("/jobs/{job_id}/cancel", response_model=JobInfo, tags=["jobs"])
def cancel(c: ClientDep, job_id: JobId) -> JobInfo:
    return c.cancel(job_id)


@router.get("/jobs/{job_id}/events", response_model=list[EventInfo], tags=["jobs"])
def job_events(c: ClientDep, job_id: JobId) -> list[EventInfo]:
    return c.events(job_id)


@router.get("/events", response_model=list[EventInfo], tags=["jobs"])
def events(c: ClientDep, user: Annotated[str | None, Query(max_length=63)] = None) -> list[EventInfo]:
    """Every event the token may see (of the jobs `user` submitted, if given)."""
    return c.events(None, user=user)


@router.get("/jobs/{job_id}/logs", response_model=LogChunk, tags=["jobs"])
def logs(c: ClientDep, job_id: JobId, attempt: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
         rank: Annotated[int, Query(ge=0, le=4096)] = 0,
         offset: Annotated[int, Query(ge=0, le=MAX_LOG_OFFSET)] = 0) -> LogChunk:
    """A rank's output from byte `offset` (at most 1 MiB); continue at `next_offset`."""
    return c.logs(job_id, attempt, rank, offset)


@router.put("/jobs/{job_id}/budget", response_model=Message, tags=["money"])
def set_job_budget(c: ClientDep, job_id: JobId, b: BudgetBody) -> Message:
    """Set a job's budget without the submit's checks (its team lead, admins)."""
    return Message(message=c.set_budget(b.usd, job_id=job_id))


Time = Annotated[float | None, Query(allow_inf_nan=False, description="unix seconds")]


@router.get("/costs", response_model=list[CostRow], tags=["money"])
def costs(c: ClientDep, by: str = "experiment", since: Time = None, until: Time = None) -> list[CostRow]:
    return c.costs(by, since, until)  # type: ignore[arg-type]


@router.get("/lost", response_model=list[LostWorkRow], tags=["money"])
def lost(c: ClientDep, by: str = "team") -> list[LostWorkRow]:
    return c.lost_work(by)  # type: ignore[arg-type]


@router.get("/budgets", tags=["money"])
def budgets(c: ClientDep) -> list[TeamBudget]:
    return c.budgets()


@router.put("/budgets/teams/{team}", response_model=Message, tags=["money"])
def set_team_budget(c: ClientDep, team: str, b: BudgetBody) -> Message:
    """Override a team's window budget (admins)."""
    return Message(message=c.set_budget(b.usd, team=team))


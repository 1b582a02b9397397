"""`GET /metrics`: the Prometheus exposition of broker.observe.metrics, and the middleware
timing every request by its route template.

Who may scrape: a bearer token of role `metrics` (`onepool token create --team T --role
metrics`: it opens no other route) or an admin token. Members may not: the metrics count
every team's jobs, spend and lost work, and name the fleet's nodes and the leader's host,
which are an operator's business. No job id or name is ever a label. Prometheus sends the
token with `authorization: {credentials_file: ...}` in its scrape config.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.api.context import bearer, ctx
from broker.errors import Forbidden
from broker.observe.metrics import HTTP_SECONDS

router = APIRouter()


@router.get("/metrics", tags=["admin"], response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                             "description": "Prometheus text exposition format"}})
def metrics(request: Request) -> Response:
    """Every metric (see the README's "Watching it"). Needs a metrics or an admin token."""
    c = ctx(request)
    with c.store.session() as s:
        who = c.verifier.api_principal(s, bearer(request), allow_metrics=True)
    if who.kind not in ("metrics", "admin"):
        raise Forbidden(f"/metrics needs a metrics or admin token (this token is a {who.kind} of "
                        f"team {who.team}); an admin creates one with `onepool token create "
                        "--team TEAM --role metrics`")
    return Response(generate_latest(c.metrics), media_type=CONTENT_TYPE_LATEST)


class TimedRoutes:
    """ASGI middleware: each HTTP request's duration into onepool_http_request_duration_seconds,
    labelled by the route template that matched (`/v1/jobs/{job_id}`; `unmatched` when none
    did), the method and the status code."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            HTTP_SECONDS.labels(getattr(route, "path", "unmatched"), scope["method"],
                                str(status[0])).observe(time.perf_counter() - t0)

"""Which rule of broker.state.access governs each route of the API (issue 28): one table, kept
whole by tests/api/test_route_rules.py, which walks every route of the app (a route added
without a rule here fails it) and calls each one as every kind of principal.

The routes themselves do not look at this table: each is one SDK call (or an agent or metrics
check) that applies the rule named here. Besides broker.state.access.Action, a route may be:
AGENT (a node credential: broker.api.routes_agent), METRICS (a metrics or admin token: GET
/metrics), PUBLIC (no token: health and the API's own documentation).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from broker.state.access import Action

AGENT, METRICS, PUBLIC = "agent", "metrics", "public"

READ, SUBMIT, CHANGE = Action.READ, Action.SUBMIT, Action.CHANGE
JOB_BUDGET, CLUSTER, ADMIN = Action.JOB_BUDGET, Action.CLUSTER, Action.ADMIN

ROUTE_RULES: dict[tuple[str, str], str] = {
    # jobs (broker.api.routes_jobs, routes_people, routes_estimate)
    ("POST", "/v1/jobs"): SUBMIT,
    ("GET", "/v1/jobs"): READ,
    ("GET", "/v1/jobs/counts"): READ,
    ("GET", "/v1/jobs/{job_id}"): READ,
    ("POST", "/v1/jobs/{job_id}/cancel"): CHANGE,
    ("PATCH", "/v1/jobs/{job_id}"): CHANGE,
    ("POST", "/v1/jobs/{job_id}/hold"): CHANGE,
    ("POST", "/v1/jobs/{job_id}/release"): CHANGE,
    ("GET", "/v1/jobs/{job_id}/events"): READ,
    ("GET", "/v1/events"): READ,
    ("GET", "/v1/jobs/{job_id}/logs"): READ,
    ("POST", "/v1/estimate"): SUBMIT,
    ("GET", "/v1/estimates"): READ,
    # code snapshots (broker.api.routes_code): whoever may submit may ask for and upload its code
    ("GET", "/v1/code/{sha256}"): SUBMIT,
    ("PUT", "/v1/code/{sha256}"): SUBMIT,
    # money
    ("PUT", "/v1/jobs/{job_id}/budget"): JOB_BUDGET,
    ("GET", "/v1/costs"): READ,
    ("GET", "/v1/lost"): READ,
    ("GET", "/v1/budgets"): READ,
    ("PUT", "/v1/budgets/teams/{team}"): ADMIN,
    # the dashboard's reads
    ("GET", "/v1/dashboard"): READ,
    ("GET", "/v1/dashboard/experiments/{experiment}/jobs"): READ,
    ("GET", "/v1/dashboard/jobs/{job_id}"): READ,
    ("GET", "/v1/dashboard/jobs/{job_id}/tail"): READ,
    # the cluster, configuration, tokens
    ("GET", "/v1/config"): CLUSTER,
    ("PUT", "/v1/config"): ADMIN,
    ("GET", "/v1/pools"): CLUSTER,
    ("GET", "/v1/rebalance/proposals"): READ,
    ("GET", "/v1/rebalance/history"): READ,  # a member sees its own team's moves
    ("POST", "/v1/replay"): ADMIN,  # the whole history under other settings (broker.sim.replay)
    ("GET", "/v1/nodes"): CLUSTER,
    ("POST", "/v1/nodes/{node}/join-token"): ADMIN,
    ("GET", "/v1/teams"): CLUSTER,
    ("POST", "/v1/tokens"): ADMIN,
    ("GET", "/v1/tokens"): ADMIN,
    ("POST", "/v1/tokens/{token_id}/revoke"): ADMIN,
    ("GET", "/v1/whoami"): CLUSTER,
    # other credentials, or none
    ("GET", "/v1/healthz"): PUBLIC,
    ("GET", "/metrics"): METRICS,
    ("POST", "/v1/agent/join"): AGENT,
    ("POST", "/v1/agent/sync"): AGENT,
    ("POST", "/v1/agent/logs"): AGENT,
    ("POST", "/v1/agent/notice"): AGENT,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
}


def endpoints(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path) of every route in `routes` (an app's `routes`), HEAD left out, included
    routers walked (whether the app lists their routes itself or holds the routers)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            ctx = getattr(r, "include_context", None)
            yield from endpoints(inner.routes, prefix + (getattr(ctx, "prefix", "") or ""))
            continue
        for method in sorted(getattr(r, "methods", None) or ()):
            if method != "HEAD":
                yield method, prefix + r.path

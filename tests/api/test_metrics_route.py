"""GET /metrics over the API: who may scrape it, and API latency by route template."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import Api


def _metrics_token(api: Api) -> str:
    tok = api.local.create_token("research", "metrics").token
    assert tok
    return tok


@pytest.mark.parametrize(("who", "status", "needle"), [
    (None, 401, "needs a token"),
    ("research", 403, "needs a metrics or admin token"),
    ("admin", 200, "onepool_jobs_pending"),
    ("metrics", 200, "onepool_jobs_pending"),
])
def test_metrics_needs_a_metrics_or_admin_token(api: Api, who: str | None, status: int, needle: str):
    token = {"research": api.research, "admin": api.admin, "metrics": _metrics_token(api),
             None: None}[who]
    r = api.http.get("/metrics", headers=api.as_(token))
    assert r.status_code == status, r.text
    assert needle in r.text


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/jobs", None), ("GET", "/v1/jobs/1", None), ("GET", "/v1/costs", None),
    ("GET", "/v1/whoami", None), ("POST", "/v1/jobs/1/cancel", None),
    ("POST", "/v1/jobs", {"name": "x", "command": ["true"]}),
])
def test_a_metrics_token_opens_no_other_route(api: Api, method: str, path: str, body: dict | None):
    r = api.http.request(method, path, headers=api.as_(_metrics_token(api)), json=body)
    assert r.status_code == 403, r.text
    assert "metrics token" in r.json()["error"]["message"]


def test_api_latency_is_labelled_by_route_template_never_by_raw_path(api: Api):
    for jid in (1, 2, 3):
        api.http.get(f"/v1/jobs/{jid}", headers=api.as_(api.research))
    api.http.get("/no/such/path")
    text = api.http.get("/metrics", headers=api.as_(api.admin)).text
    [fam] = [f for f in text_string_to_metric_families(text)
             if f.name == "onepool_http_request_duration_seconds"]
    routes = {s.labels["route"] for s in fam.samples if s.name.endswith("_count")}
    assert "/v1/jobs/{job_id}" in routes and "unmatched" in routes
    assert not any(r.startswith("/v1/jobs/") and r[-1].isdigit() for r in routes)
    counts = {(s.labels["route"], s.labels["method"], s.labels["status"]): s.value for s in fam.samples
              if s.name.endswith("_count")}  # the method too: PATCH /v1/jobs/{job_id} is another route
    assert counts[("/v1/jobs/{job_id}", "GET", "404")] >= 3

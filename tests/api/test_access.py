"""Who may do what over the API: members act within their team, admins manage, tokens are
hashed and revocable, every change names its actor, and a retried submit makes one job."""

from __future__ import annotations

import os
import stat

import pytest
from sqlmodel import select

from broker.state.model import Job
from broker.state.model_access import ApiToken
from tests.api.conftest import Api

JOB = {"name": "j", "command": ["true"], "gpus_per_node": 1}


def submit(api: Api, token: str, **kw: object) -> dict:
    r = api.http.post("/v1/jobs", json={**JOB, **kw}, headers=api.as_(token))
    assert r.status_code == 201, r.text
    return r.json()


# (method, path template, body, status, error type): every route that reads or changes one job
# of another team. A member is told such a job does not exist (tests/api/test_bounds.py: the
# same answer as an unknown id), whatever the route.
JOB_ROUTES = [
    ("GET", "/v1/jobs/{id}", None, 404, "NotFound"),
    ("POST", "/v1/jobs/{id}/cancel", None, 404, "NotFound"),
    ("GET", "/v1/jobs/{id}/events", None, 404, "NotFound"),
    ("GET", "/v1/jobs/{id}/logs", None, 404, "NotFound"),
    ("PUT", "/v1/jobs/{id}/budget", {"usd": 5}, 404, "NotFound"),
    ("PATCH", "/v1/jobs/{id}", {"priority": "low"}, 404, "NotFound"),
    ("POST", "/v1/jobs/{id}/hold", None, 404, "NotFound"),
    ("POST", "/v1/jobs/{id}/release", None, 404, "NotFound"),
]
ADMIN_ROUTES = [
    ("PUT", "/v1/config", {"pools": [], "teams": []}),
    ("POST", "/v1/tokens", {"team": "research", "role": "admin"}),
    ("GET", "/v1/tokens", None),
    ("POST", "/v1/tokens/abc/revoke", None),
    ("POST", "/v1/nodes/onprem-0/join-token", None),
    ("PUT", "/v1/budgets/teams/research", {"usd": 1000}),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "kind"), JOB_ROUTES)
def test_a_member_cannot_touch_another_teams_job(api: Api, method: str, path: str, body: dict | None,
                                                 status: int, kind: str):
    other = submit(api, api.prod)["id"]
    r = api.http.request(method, path.format(id=other), json=body, headers=api.as_(api.research))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == kind
    assert f"no job with id {other}" in err["message"] or "admin" in err["message"]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_ROUTES)
def test_admin_routes_refuse_members(api: Api, method: str, path: str, body: dict | None):
    r = api.http.request(method, path, json=body, headers=api.as_(api.research))
    assert r.status_code == 403 and "admin" in r.json()["error"]["message"]


def test_a_member_submits_for_its_own_team_only_and_sees_only_its_team(api: Api):
    r = api.http.post("/v1/jobs", json={**JOB, "team": "prod", "priority": "urgent"},
                      headers=api.as_(api.research))
    assert r.status_code == 403 and "acts for team research only" in r.json()["error"]["message"]
    mine = submit(api, api.research)  # the team defaults to the token's
    assert mine["team"] == "research"
    submit(api, api.prod)
    listed = api.http.get("/v1/jobs", headers=api.as_(api.research)).json()["jobs"]
    assert [j["team"] for j in listed] == ["research"]
    assert api.http.get("/v1/jobs?team=prod", headers=api.as_(api.research)).status_code == 403
    events = api.http.get("/v1/events", headers=api.as_(api.research)).json()
    assert {e["job_id"] for e in events} == {mine["id"]}
    assert len(api.http.get("/v1/jobs", headers=api.as_(api.admin)).json()["jobs"]) == 2


@pytest.mark.parametrize(("headers", "needle"), [
    ({}, "needs a token"),
    ({"Authorization": "Bearer nonsense"}, "not an API token"),
    ({"Authorization": "Bearer op_0123456789ab_" + "x" * 43}, "not known"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "needs a token"),
])
def test_requests_without_a_valid_token_get_401(api: Api, headers: dict, needle: str):
    r = api.http.get("/v1/jobs", headers=headers)
    assert r.status_code == 401 and needle in r.json()["error"]["message"]
    assert r.headers["www-authenticate"] == "Bearer"


def test_a_revoked_token_is_refused_on_every_route(api: Api):
    job = submit(api, api.research)["id"]
    tid = api.research.split("_")[1]
    r = api.http.post(f"/v1/tokens/{tid}/revoke", headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    routes = [*(r[:3] for r in JOB_ROUTES), ("GET", "/v1/jobs", None), ("POST", "/v1/jobs", JOB),
              ("GET", "/v1/costs", None), ("GET", "/v1/nodes", None)]
    for method, path, body in routes:
        r = api.http.request(method, path.format(id=job), json=body, headers=api.as_(api.research))
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"], (method, path)


def test_tokens_are_stored_hashed_and_shown_once(api: Api):
    r = api.http.post("/v1/tokens", json={"team": "prod", "role": "member", "note": "ci"},
                      headers=api.as_(api.admin))
    created = r.json()
    assert r.status_code == 201 and created["token"].startswith("op_")
    with api.local.store.session() as s:
        rows = s.exec(select(ApiToken)).all()
    assert all(row.hash.startswith("hmac-sha256$") for row in rows)
    assert not any(created["token"] in row.hash for row in rows)
    listed = api.http.get("/v1/tokens", headers=api.as_(api.admin)).json()
    assert all(t["token"] is None for t in listed) and created["id"] in {t["id"] for t in listed}
    bad = api.http.post("/v1/tokens", json={"team": "nope", "role": "boss"}, headers=api.as_(api.admin))
    assert bad.status_code == 422
    assert bad.json()["error"]["problems"] == [
        "role: must be one of member, lead, admin, metrics (got 'boss')"]


def test_a_retried_submit_with_the_same_idempotency_key_makes_one_job(api: Api):
    h = {**api.as_(api.research), "Idempotency-Key": "run-42"}
    a = api.http.post("/v1/jobs", json=JOB, headers=h)
    b = api.http.post("/v1/jobs", json=JOB, headers=h)
    assert a.status_code == b.status_code == 201 and a.json()["id"] == b.json()["id"]
    other = api.http.post("/v1/jobs", json={**JOB, "name": "k"}, headers=h)
    assert other.status_code == 422 and "already used for a different job" in other.text
    # Keys belong to their token: another team's same key is another job.
    c = api.http.post("/v1/jobs", json=JOB, headers={**api.as_(api.prod), "Idempotency-Key": "run-42"})
    assert c.json()["id"] != a.json()["id"]
    with api.local.store.session() as s:
        assert len(s.exec(select(Job)).all()) == 2


def test_every_change_records_who_made_it(api: Api):
    job = submit(api, api.research)["id"]
    api.http.post(f"/v1/jobs/{job}/cancel", headers=api.as_(api.research))
    api.http.put(f"/v1/jobs/{job}/budget", json={"usd": 3}, headers=api.as_(api.admin))
    events = api.http.get(f"/v1/jobs/{job}/events", headers=api.as_(api.admin)).json()
    rid, aid = api.research.split("_")[1], api.admin.split("_")[1]
    actors = {e["kind"]: e["actor"] for e in events}
    assert actors["submitted"] == f"token:{rid} (research member)"
    assert actors["cancelled"] == f"token:{rid} (research member)"  # it was pending
    assert actors["budget_set"] == f"token:{aid} (research admin)"
    assert api.local.get(job).model_dump()["team"] == "research"


@pytest.mark.parametrize(("body", "problem"), [
    ({**JOB, "priority": "vip"}, "priority: must be one of 'urgent', 'high', 'normal' or 'low'"),
    ({**JOB, "gpus_per_node": 0}, "gpus_per_node"),
    ({**JOB, "budget_usd": -1}, "budget_usd"),
    ([1, 2], "(root): must be a JSON object"),
    ({**JOB, "bogus": 1}, "bogus: unknown field"),
])
def test_bad_input_is_a_422_naming_the_field(api: Api, body: object, problem: str):
    r = api.http.post("/v1/jobs", json=body, headers=api.as_(api.research))
    assert r.status_code == 422
    assert any(problem.split(":")[0] in p for p in r.json()["error"]["problems"]), r.json()


def test_query_errors_name_the_parameter(api: Api):
    r = api.http.get("/v1/jobs?limit=0&status=NOPE", headers=api.as_(api.admin))
    assert r.status_code == 422 and "limit" in r.text
    r = api.http.get("/v1/jobs?status=NOPE", headers=api.as_(api.admin))
    assert r.status_code == 422 and "status: must be one of pending, running" in r.text


def test_agent_routes_refuse_api_tokens(api: Api):
    r = api.http.post("/v1/agent/sync", json={}, headers=api.as_(api.admin))
    assert r.status_code == 401 and "node credential" in r.json()["error"]["message"]


def test_the_home_and_database_are_readable_by_their_owner_only(api: Api):
    home = api.local.store.home
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(home / "onepool.db").st_mode) == 0o600


def test_healthz_needs_no_token_and_says_when_no_broker_cycled(api: Api):
    r = api.http.get("/v1/healthz")
    assert r.status_code == 200 and r.json()["broker_up"] is False
    assert r.json()["summary"] == "no broker has ever run on this database"

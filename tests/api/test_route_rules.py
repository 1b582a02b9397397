"""Who may do what, route by route (issue 28): every route of the app has a rule in
broker.api.route_rules (a new route without one fails here), and every route, called as each
kind of principal, refuses exactly those broker.state.access.allowed() refuses.

One home for the module (the calls are in-process, a few hundred of them): a job of team
research submitted by alice; tokens of an admin, research's lead, alice, bob (another member of
research), a research team token without a user, and carol of team prod.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.api.route_rules import AGENT, METRICS, PUBLIC, ROUTE_RULES, endpoints
from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.spec import parse_config
from broker.state.access import Action, allowed
from broker.state.tokens import Principal
from tests.api.conftest import AGENT_POOL
from tests.conftest import config

JOB = {"name": "j", "command": ["true"], "gpus_per_node": 1}
# (kind, team, user) of each token the module makes
WHO = {"admin": ("admin", "research", None), "lead": ("lead", "research", None),
       "alice": ("member", "research", "alice"), "bob": ("member", "research", "bob"),
       "team": ("member", "research", None), "carol": ("member", "prod", "carol")}


@dataclass
class Home:
    http: TestClient
    tokens: dict[str, str]
    job: int  # alice's job in team research

    def call(self, method: str, path: str, token: str | None, body: Any = None,
             params: dict[str, Any] | None = None) -> Any:
        return self.http.request(method, path, json=body, params=params,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Home]:
    from _pytest.monkeypatch import MonkeyPatch

    import broker.state.store
    from tests.conftest import _from_template

    mp = MonkeyPatch()  # module scope: what the autouse `db` fixture does for each test
    mp.delenv("ONEPOOL_DATABASE_URL", raising=False)
    mp.setattr(broker.state.store, "upgrade", _from_template(sqlite_template, broker.state.store.upgrade))
    clock = FakeClock()
    local = Client(Path(tmp_path_factory.mktemp("rules")) / "home", clock=clock)
    local.apply(parse_config(config(pools=[
        {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}, AGENT_POOL],
        api={"auth_failure_burst": 10_000})))  # the calls without a token are no flood here
    tokens = {name: local.create_token(team, kind, user=user).token or ""
              for name, (kind, team, user) in WHO.items()}
    with TestClient(create_app(local.store, clock)) as http:
        h = Home(http, tokens, 0)
        r = h.call("POST", "/v1/jobs", tokens["alice"], JOB)
        assert r.status_code == 201, r.text
        h.job = r.json()["id"]
        yield h
    mp.undo()


def sample(method: str, path: str, job: int) -> tuple[str, Any, dict[str, Any] | None]:
    """A request to (method, path): its URL, body and query."""
    url = path.replace("{job_id}", str(job)).replace("{team}", "research").replace(
        "{node}", "onprem-0").replace("{token_id}", "abc").replace("{experiment}", "default").replace(
        "{sha256}", "0" * 64)
    bodies: dict[tuple[str, str], Any] = {
        ("POST", "/v1/jobs"): JOB, ("POST", "/v1/estimate"): JOB,
        ("PATCH", "/v1/jobs/{job_id}"): {"priority": "low"},
        ("PUT", "/v1/jobs/{job_id}/budget"): {"usd": 5},
        ("PUT", "/v1/budgets/teams/{team}"): {"usd": 1000},
        ("PUT", "/v1/config"): {"pools": [], "teams": []},
        ("POST", "/v1/tokens"): {"team": "research"}, ("POST", "/v1/replay"): {"sets": []},
    }
    params = {("GET", "/v1/estimates"): {"job_id": job},
              ("GET", "/v1/dashboard/jobs/{job_id}/tail"): {"attempt": 1}}
    return url, bodies.get((method, path)), params.get((method, path))


def refused(r: Any) -> bool:
    """A refusal of who asked: 401, 403, or the NotFound a job of another team gets."""
    if r.status_code in (401, 403):
        return True
    if r.status_code != 404:
        return False
    return "no job with id" in r.json().get("error", {}).get("message", "")


def test_every_route_has_a_rule_and_every_rule_a_route(home: Home):
    routes = set(endpoints(home.http.app.routes))  # type: ignore[attr-defined]
    assert routes - set(ROUTE_RULES) == set(), "add these routes to broker.api.route_rules"
    assert set(ROUTE_RULES) - routes == set(), "rules of routes that no longer exist"


# CHANGE routes come last (alice's cancel ends the job; who may is checked before the state).
OTHER = (AGENT, METRICS, PUBLIC)  # credentials other than API tokens, or none
ORDER = sorted(ROUTE_RULES, key=lambda r: (ROUTE_RULES[r] == Action.CHANGE, r[0] == "POST" and
                                           r[1].endswith("/cancel"), r))


@pytest.mark.parametrize(("method", "path"), [r for r in ORDER if ROUTE_RULES[r] not in OTHER])
def test_each_route_refuses_exactly_whom_the_rule_refuses(home: Home, method: str, path: str):
    action = Action(ROUTE_RULES[(method, path)])
    url, body, params = sample(method, path, home.job)
    on_job = "{job_id}" in path or (params or {}).get("job_id") is not None
    for name, (kind, team, user) in WHO.items():
        p = Principal(kind, team, "x", user)
        expect = allowed(p, action, "research" if on_job else None, "alice" if on_job else None)
        r = home.call(method, url, home.tokens[name], body, params)
        assert refused(r) == (not expect), f"{method} {path} as {name}: {r.status_code} {r.text[:300]}"
    assert home.call(method, url, None, body, params).status_code == 401  # no token


@pytest.mark.parametrize(("method", "path"), [r for r in ROUTE_RULES if ROUTE_RULES[r] in OTHER])
def test_routes_of_other_credentials(home: Home, method: str, path: str):
    url, body, params = sample(method, path, home.job)
    for name in WHO:
        r = home.call(method, url, home.tokens[name], body or {}, params)
        rule = ROUTE_RULES[(method, path)]
        if rule == PUBLIC:
            assert r.status_code == 200, (path, name, r.text[:200])
        elif rule == METRICS:
            assert refused(r) == (name != "admin"), (path, name, r.status_code)
        else:  # an API token is no node credential
            assert r.status_code in (401, 422), (path, name, r.status_code, r.text[:200])

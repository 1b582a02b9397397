"""POST /v1/replay and GET /v1/rebalance/history over HTTP (issue 31): admins replay; a
member is refused the replay and sees only its own team's moves; a bad setting is a 4xx
naming the field."""

from __future__ import annotations

import pytest

from broker.state.events import record
from tests.api.conftest import Api
from tests.history import Rec
from tests.history import record as record_history


@pytest.fixture
def api_with_history(api: Api) -> Api:
    jobs = [Rec("research" if i % 2 else "prod", 100.0 * i, 600.0) for i in range(6)]
    record_history(api.local, jobs, gpus=2, t0=api.clock.now())
    api.clock.advance(3600)
    return api


def test_an_admin_replays_over_http_as_the_sdk_does(api_with_history: Api) -> None:
    api = api_with_history
    r = api.http.post("/v1/replay", json={"sets": ["teams.research.weight=4"]}, headers=api.as_(api.admin))
    assert r.status_code == 200, r.text
    assert r.json() == api.local.replay(["teams.research.weight=4"])
    assert r.json()["jobs"] == 6


@pytest.mark.parametrize(("who", "body", "status", "says"), [
    ("research", {"sets": ["broker.grace_s=120"]}, 403, "admin"),
    ("admin", {"sets": ["broker.grace_sec=120"]}, 422, "broker.grace_sec: unknown field"),
    ("admin", {"sets": ["teams.ml.weight=2"]}, 422, "teams.ml: no such item"),
    ("admin", {"sets": [], "since": -1}, 422, "since"),
    ("admin", {"sets": [], "extra": 1}, 422, "extra"),
])
def test_replay_refusals(api_with_history: Api, who: str, body: dict, status: int, says: str) -> None:  # type: ignore[type-arg]
    api = api_with_history
    r = api.http.post("/v1/replay", json=body, headers=api.as_(getattr(api, who)))
    assert r.status_code == status, r.text
    assert says in r.text


def test_rebalance_history_a_member_sees_its_own_teams_moves(api_with_history: Api) -> None:
    api = api_with_history
    with api.local.store.session() as s:
        for job in (1, 2):  # job 1: prod's, job 2: research's (tests.history: alternating)
            record(s, float(job), "rebalance_realized", "done", job_id=job, from_pool="od", to_pool="a100",
                   expected_saving_usd=10.0, realized_gross_usd=5.0)
        s.commit()
    mine = api.http.get("/v1/rebalance/history", headers=api.as_(api.research)).json()
    every = api.http.get("/v1/rebalance/history", headers=api.as_(api.admin)).json()
    assert [m["job"] for m in mine["moves"]] == [2]
    assert [m["job"] for m in every["moves"]] == [2, 1]
    assert api.http.get("/v1/rebalance/history?limit=0", headers=api.as_(api.admin)).status_code == 422

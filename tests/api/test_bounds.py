"""What a client may send and learn: ids and offsets past what the database holds are a 422
naming the field (not an overflow deep in a query), a job spec too big to start is refused at
submit, another team's job is indistinguishable from no job, and a member sees only its own
team's job ids on the nodes."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from broker.control.engine import Engine
from broker.errors import SpecError
from providers.local import LocalProcesses
from tests.api.conftest import Api
from tests.conftest import kill_leftovers

JOB = {"name": "j", "command": ["true"], "gpus_per_node": 1}
BIG = 2**63  # one past the largest database integer
TIB16 = 2**44


@pytest.fixture
def agent(api: Api) -> dict[str, str]:
    """Headers of a joined agent (node onprem-0 of the agent pool)."""
    token = api.local.join_token("onprem-0").join_token
    r = api.http.post("/v1/agent/join", json={"join_token": token, "info": {}})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['credential']}"}


# (path, body, the field the error names): each answered 500 (OverflowError) before
AGENT_OUT_OF_RANGE = [
    pytest.param("/v1/agent/sync", {"known": [BIG]}, "known.0", id="sync-known"),
    pytest.param("/v1/agent/sync", {"acked": {str(BIG): 1}}, f"acked.{BIG}.[key]", id="sync-acked-key"),
    pytest.param("/v1/agent/sync", {"acked": {"1": BIG}}, "acked.1", id="sync-acked-seq"),
    pytest.param("/v1/agent/sync", {"ranks": [{"assignment_id": BIG, "state": "running"}]},
                 "ranks.0.assignment_id", id="sync-rank-id"),
    pytest.param("/v1/agent/sync", {"ranks": [{"assignment_id": 1, "state": "running", "pid": BIG}]},
                 "ranks.0.pid", id="sync-rank-pid"),
    pytest.param("/v1/agent/logs", {"assignment_id": BIG, "offset": 0, "data_b64": ""},
                 "assignment_id", id="logs-id"),
    pytest.param("/v1/agent/logs", {"assignment_id": 1, "offset": TIB16 + 1, "data_b64": ""},
                 "offset", id="logs-offset-16tib"),
    pytest.param("/v1/agent/notice", {"kind": "rebalance", "deadline": "Infinity"}, "deadline",
                 id="notice-deadline-inf"),
]


@pytest.mark.parametrize(("path", "body", "field"), AGENT_OUT_OF_RANGE)
def test_agent_ids_and_offsets_out_of_range_are_422(api: Api, agent: dict[str, str], path: str,
                                                     body: dict, field: str) -> None:
    r = api.http.post(path, json=body, headers=agent)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "SpecError"
    assert any(p.startswith(f"{field}:") for p in err["problems"]), err["problems"]


@pytest.mark.parametrize(("query", "field"), [
    (f"offset={TIB16 + 1}", "offset"), (f"offset={BIG}", "offset"), (f"attempt={BIG}", "attempt"),
    ("offset=-1", "offset"),
])
def test_job_log_offsets_out_of_range_are_422(api: Api, query: str, field: str) -> None:
    job = api.http.post("/v1/jobs", json=JOB, headers=api.as_(api.research)).json()["id"]
    r = api.http.get(f"/v1/jobs/{job}/logs?{query}", headers=api.as_(api.research))
    assert r.status_code == 422, r.text
    assert any(p.startswith(f"{field}:") for p in r.json()["error"]["problems"])


def test_a_200kb_argument_is_refused_at_submit_naming_the_field(api: Api) -> None:
    r = api.http.post("/v1/jobs", json={**JOB, "command": ["echo", "x" * 200_000]},
                      headers=api.as_(api.research))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "SpecError"
    assert err["problems"] == ["command: item 1 is 200000 bytes; one argument may be at most 64 KiB "
                               "(pass large data in a file the job reads, not on its command line)"]
    with pytest.raises(SpecError) as embedded:  # the SDK on the home: the same refusal
        api.local.submit({**JOB, "team": "research", "command": ["echo", "x" * 200_000]})
    assert embedded.value.problems == err["problems"]
    assert api.http.get("/v1/jobs", headers=api.as_(api.admin)).json()["jobs"] == []


# every route that names one job: another team's job answers exactly as a job that is not there
ONE_JOB_ROUTES = [
    ("GET", "/v1/jobs/{id}"), ("POST", "/v1/jobs/{id}/cancel"), ("GET", "/v1/jobs/{id}/events"),
    ("GET", "/v1/jobs/{id}/logs"),
]


@pytest.mark.parametrize(("method", "path"), ONE_JOB_ROUTES)
def test_another_teams_job_answers_as_an_unknown_one(api: Api, method: str, path: str) -> None:
    theirs = api.http.post("/v1/jobs", json=JOB, headers=api.as_(api.prod)).json()["id"]
    unknown = theirs + 1000
    a = api.http.request(method, path.format(id=theirs), headers=api.as_(api.research))
    b = api.http.request(method, path.format(id=unknown), headers=api.as_(api.research))
    assert a.status_code == b.status_code == 404, (a.text, b.text)
    assert a.json() == {"error": {"type": "NotFound", "message": f"no job with id {theirs}"}}
    assert b.json()["error"]["message"] == f"no job with id {unknown}"
    mine = api.http.request(method, path.format(id=theirs), headers=api.as_(api.prod))
    assert mine.status_code != 404 or "not started" in mine.text  # the owner still reaches it


@pytest.fixture
def running_pair(api: Api) -> Iterator[tuple[int, int]]:
    """One job of each team, both running on node a100-0 (real processes, killed after)."""
    engine = Engine(api.local.store, api.clock, LocalProcesses(api.local.store.home / "runs"))
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    ids = [api.http.post("/v1/jobs", json={**JOB, "command": sleep, "gpu_types": ["A100"]},
                         headers=api.as_(tok)).json()["id"] for tok in (api.research, api.prod)]
    engine.cycle()
    try:
        assert {j.status for j in (api.local.get(i) for i in ids)} == {"RUNNING"}
        yield ids[0], ids[1]
    finally:
        engine.close()
        kill_leftovers(api.local.store.home / "runs")


def test_members_see_only_their_teams_jobs_on_nodes(api: Api, running_pair: tuple[int, int]) -> None:
    research_job, prod_job = running_pair

    def held(token: str, path: str = "/v1/nodes") -> set[int]:
        r = api.http.get(path, headers=api.as_(token))
        assert r.status_code == 200, r.text
        return {j for n in r.json() for j in n["jobs"]}

    assert held(api.admin) == {research_job, prod_job}
    assert held(api.research) == {research_job}
    assert held(api.prod) == {prod_job}
    nodes = api.http.get("/v1/nodes", headers=api.as_(api.research)).json()
    assert next(n for n in nodes if n["id"] == "a100-0")["free_gpus"] == 0  # the GPUs still show as used
    from broker.client.sdk import Client
    from broker.state.tokens import Principal

    member = Client(store=api.local.store, clock=api.clock,
                    principal=Principal(kind="member", team="prod", id="t"))
    assert {j for p in member.pools() for n in p.nodes for j in n.jobs} == {prod_job}


@pytest.mark.parametrize("query", ["since=nan", "since=inf", "until=-inf"])
def test_cost_windows_must_be_finite_times(api: Api, query: str) -> None:
    r = api.http.get(f"/v1/costs?{query}", headers=api.as_(api.admin))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["problems"] == [f"{query.split('=')[0]}: Input should be a finite number"]

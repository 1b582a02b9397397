"""The SDK behaves the same embedded and over HTTP: one suite, run in both modes, plus a
check that every error comes back as the same exception with the same message."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.client.http import HttpClient
from broker.errors import Forbidden, InvalidState, NotFound, OnepoolError, SpecError, Unauthorized
from tests.agents.harness import serve
from tests.api.conftest import Api

JOB = {"name": "j", "team": "research", "command": ["true"], "gpus_per_node": 1}


@pytest.fixture
def server_url(api: Api) -> Iterator[str]:
    srv = serve(api.app)
    yield srv.url
    srv.stop()


@pytest.fixture(params=["embedded", "http"])
def sdk(request: pytest.FixtureRequest, api: Api) -> Any:
    if request.param == "embedded":
        return api.local
    return HttpClient(request.getfixturevalue("server_url"), api.admin)


def test_submit_get_list_cancel(sdk: Any) -> None:
    a = sdk.submit(JOB, priority="high", budget_usd=10)
    b = sdk.submit({**JOB, "name": "k", "experiment": "e1"})
    assert (a.status, a.priority, a.budget_usd, a.gpus_per_node) == ("PENDING", "high", 10.0, 1)
    assert sdk.get(a.id) == a
    assert [j.id for j in sdk.list()] == [a.id, b.id]
    assert [j.id for j in sdk.list(experiment="e1")] == [b.id]
    assert [j.id for j in sdk.list(after_id=a.id, limit=1)] == [b.id]
    assert sdk.cancel(a.id).id == a.id
    assert [e.kind for e in sdk.events(a.id)] == ["submitted", "cancelled"]  # it was pending
    assert sdk.list(status=["succeeded"]) == []


def test_money_and_capacity(sdk: Any) -> None:
    j = sdk.submit(JOB).id
    assert "budget set to $2.0000" in sdk.set_budget(2.0, job_id=j)
    assert "team research" in sdk.set_budget(50.0, team="research")
    assert {b.team: b.amount for b in sdk.budgets()} == {"research": 50.0, "prod": None}
    assert sdk.costs("team") == [] and sdk.lost_work("cause") == []
    nodes = {n.id: n for n in sdk.nodes()}
    assert nodes["a100-0"].free_gpus == 2 and nodes["a100-0"].executor == "local"
    assert nodes["onprem-0"].state == "waiting" and nodes["onprem-0"].executor == "agent"
    assert sdk.join_token("onprem-0").join_token.startswith("opj_")
    t = sdk.create_token("prod", "member", "ci")
    assert t.token and sdk.revoke_token(t.id).revoked_at is not None


def test_update_hold_release(sdk: Any) -> None:
    """Issue 28: a change after submit, the same in both modes, each an event naming its actor."""
    j = sdk.submit(JOB, budget_usd=1.0).id
    info = sdk.update(j, priority="urgent", budget_usd=2.5)
    assert (info.priority, info.budget_usd) == ("urgent", 2.5)
    assert sdk.hold(j).held_by is not None and sdk.hold(j).status == "PENDING"  # twice: no-op
    assert sdk.release(j).held_by is None
    evs = [(e.kind, e.actor) for e in sdk.events(j)][1:]
    assert [k for k, _ in evs] == ["priority_changed", "budget_set", "held", "released"]
    assert len({a for _, a in evs}) == 1 and evs[0][1] != "broker"
    assert [i.id for i in sdk.list(user="nobody")] == []


CALLS: list[tuple[str, Callable[[Any], Any], type[OnepoolError]]] = [
    ("bad update priority", lambda c: c.update(c.submit(JOB).id, priority="vip"), SpecError),
    ("update of nothing", lambda c: c.update(c.submit(JOB).id), SpecError),
    ("update of an ended job", lambda c: c.update(c.cancel(c.submit(JOB).id).id, priority="low"),
     InvalidState),
    ("hold of no such job", lambda c: c.hold(999), NotFound),
    ("bad user filter", lambda c: c.list(user="a b"), SpecError),
    ("events of a job and a user", lambda c: c.events(1, user="alice"), SpecError),
    ("bad priority", lambda c: c.submit({**JOB, "priority": "vip"}), SpecError),
    ("unknown team", lambda c: c.submit({**JOB, "team": "ml"}), SpecError),
    ("no such job", lambda c: c.get(999), NotFound),
    ("no such job to cancel", lambda c: c.cancel(999), NotFound),
    ("bad cost grouping", lambda c: c.costs("planet"), SpecError),
    ("bad state filter", lambda c: c.list(status=["DONE"]), SpecError),
    ("no such node", lambda c: c.join_token("nope"), NotFound),
    ("join token for a local node", lambda c: c.join_token("a100-0"), SpecError),
    ("negative budget", lambda c: c.set_budget(-1.0, team="research"), SpecError),
    ("logs of a job not started", lambda c: c.logs(c.submit(JOB).id), NotFound),
]


@pytest.mark.parametrize(("what", "call", "kind"), CALLS, ids=[c[0] for c in CALLS])
def test_errors_are_the_same_exception_with_the_same_message(api: Api, server_url: str, what: str,
                                                             call: Callable[[Any], Any],
                                                             kind: type[OnepoolError]) -> None:
    got = []
    for c in (api.local, HttpClient(server_url, api.admin)):
        with pytest.raises(kind) as e:
            call(c)
        got.append(re.sub(r"\d+", "N", str(e.value)))
    assert got[0] == got[1], what


def test_cancelling_twice_after_the_end_is_invalid_in_both_modes(api: Api, server_url: str) -> None:
    j = api.local.submit(JOB).id
    with api.local.store.session() as s:
        from broker.state.model import Job

        row = s.get(Job, j)
        assert row is not None
        row.state = "SUCCEEDED"
        s.add(row)
    msgs = []
    for c in (api.local, HttpClient(server_url, api.admin)):
        with pytest.raises(InvalidState) as e:
            c.cancel(j)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1] == f"job {j} already ended (SUCCEEDED); nothing to cancel"


def test_http_client_errors_for_members_and_bad_tokens(api: Api, server_url: str) -> None:
    with pytest.raises(Forbidden, match="team research only"):
        HttpClient(server_url, api.research).submit({**JOB, "team": "prod"})
    with pytest.raises(Unauthorized, match="needs a token"):
        HttpClient(server_url, None).list()


def test_estimates_and_workflows(sdk: Any) -> None:
    """Issue 29 in both modes: an estimate writes nothing; an array and its dependency come
    back with their fields; a pending job has an estimate."""
    est = sdk.estimate({**JOB, "expected_duration_s": 600})
    assert (est.job_id, est.pool, est.runtime_s) == (None, "a100", 600) and est.wait_p50_s == 0
    assert sdk.list() == []
    first = sdk.submit({**JOB, "array": "0-1%1", "retries": 2})
    assert (first.array_id, first.array_index, first.retries) == (first.id, 0, 2)
    then = sdk.submit({**JOB, "after": [f"{first.id}[*]:any"]})
    assert then.after == [[first.id, "any"], [first.id + 1, "any"]]
    assert [e.job_id for e in sdk.estimates([first.id])] == [first.id]
    with pytest.raises(SpecError, match="after: no job with id 999"):
        sdk.submit({**JOB, "after": ["999"]})

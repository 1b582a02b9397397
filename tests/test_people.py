"""People inside teams and changes after submit (issue 28 parts 2 and 3): the access rule as a
table, bad input as a table, a job's user and the user views, update under the submit's rules,
hold and release with the engine (a held job is never placed and says why)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.client.sdk import Client
from broker.errors import BudgetError, Forbidden, InvalidState, NotFound, SpecError
from broker.state.access import Action, allowed
from broker.state.model import Attempt, AttemptState, Job, JobState, LedgerEntry
from broker.state.tokens import Principal
from tests.conftest import drive, train

ONPREM = {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "price_per_node_hour": 7.2}
SPOT = {"name": "spot", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "market": "spot",
        "price_per_node_hour": 2.0}


def who(kind: str, team: str | None = "research", user: str | None = None) -> Principal:
    return Principal(kind, team, f"{kind}-{user}", user)


ALICE, BOB, TEAM = who("member", user="alice"), who("member", user="bob"), who("member")
LEAD, ADMIN, CAROL = who("lead", user="lea"), who("admin"), who("member", "prod", "carol")
A = Action

# (principal, action, the job's team, the job's user, allowed): README "Who can do what"
RULES = [
    (ALICE, A.READ, "research", "bob", True), (ALICE, A.READ, "prod", "carol", False),
    (ALICE, A.SUBMIT, "research", None, True), (ALICE, A.SUBMIT, "prod", None, False),
    (ALICE, A.CHANGE, "research", "alice", True), (ALICE, A.CHANGE, "research", "bob", False),
    (ALICE, A.CHANGE, "research", None, False), (ALICE, A.CHANGE, "prod", "alice", False),
    (ALICE, A.JOB_BUDGET, "research", "alice", False),
    (ALICE, A.CLUSTER, None, None, True), (ALICE, A.ADMIN, None, None, False),
    (TEAM, A.CHANGE, "research", "bob", True), (TEAM, A.CHANGE, "research", None, True),
    (TEAM, A.CHANGE, "prod", None, False), (TEAM, A.JOB_BUDGET, "research", None, False),
    (LEAD, A.CHANGE, "research", "bob", True), (LEAD, A.JOB_BUDGET, "research", "bob", True),
    (LEAD, A.JOB_BUDGET, "prod", "carol", False), (LEAD, A.READ, "prod", "carol", False),
    (LEAD, A.ADMIN, None, None, False),
    (ADMIN, A.CHANGE, "prod", "carol", True), (ADMIN, A.JOB_BUDGET, "prod", None, True),
    (ADMIN, A.ADMIN, None, None, True), (who("local", None, None), A.ADMIN, None, None, True),
    (who("metrics"), A.READ, "research", None, False), (who("metrics"), A.CLUSTER, None, None, False),
    (who("agent", None), A.READ, None, None, False),
]


@pytest.mark.parametrize(("p", "action", "team", "owner", "ok"), RULES)
def test_the_access_rule(p: Principal, action: Action, team: str | None, owner: str | None, ok: bool):
    assert allowed(p, action, team, owner) is ok


@pytest.fixture
def home(make_cluster: Any) -> tuple[Client, Any, dict[str, Client]]:
    """An embedded home (one local pool, teams research and prod) and SDK clients acting as
    alice, bob, research's lead, a research team token and carol of prod."""
    c, eng = make_cluster(pools=[ONPREM, SPOT])
    as_ = {name: Client(store=c.store, clock=c.clock, principal=p)
           for name, p in (("alice", ALICE), ("bob", BOB), ("lead", LEAD), ("team", TEAM),
                           ("carol", CAROL))}
    return c, eng, as_


@pytest.mark.parametrize(("kw", "problem"), [
    ({}, "(root): give a priority, a budget_usd, or both"),
    ({"priority": "vip"}, "priority: must be one of urgent, high, normal, low (got 'vip')"),
    ({"budget_usd": -1.0}, "budget_usd: must be a finite number of USD >= 0 (got -1.0)"),
    ({"budget_usd": float("nan")}, "budget_usd: must be a finite number of USD >= 0 (got nan)"),
    ({"budget_usd": float("inf")}, "budget_usd: must be a finite number of USD >= 0 (got inf)"),
])
def test_bad_updates_name_the_field_and_allowed_values(home, kw: dict[str, Any], problem: str):
    c, _, _ = home
    j = c.submit(name="j", team="research", command=["true"]).id
    with pytest.raises(SpecError) as e:
        c.update(j, **kw)
    assert e.value.problems == [problem]


@pytest.mark.parametrize(("user", "role", "problem"), [
    ("", "member", "user: must be 1 to 63 letters"),
    ("a b", "member", "user: must be 1 to 63 letters"),
    ("-alice", "member", "user: must be 1 to 63 letters"),
    ("x" * 64, "lead", "user: must be 1 to 63 letters"),
    ("prom", "metrics", "user: a metrics token reads GET /metrics only"),
    ("alice", "boss", "role: must be one of member, lead, admin, metrics (got 'boss')"),
])
def test_bad_token_users_and_roles(home, user: str, role: str, problem: str):
    c, _, _ = home
    with pytest.raises(SpecError) as e:
        c.create_token("research", role, user=user)
    assert e.value.problems[0].startswith(problem)


def test_an_actor_fits_its_columns_whatever_the_names():
    long = Principal("member", "t" * 63, "0123456789ab", "u" * 63)
    assert len(long.actor) == 120 and long.actor.startswith("token:0123456789ab (" + "t" * 63 + " member u")
    assert who("member", user="alice").actor == "token:member-alice (research member alice)"


def test_jobs_record_their_user_and_views_filter_by_it(home):
    c, _, as_ = home
    a = as_["alice"].submit(name="a", command=["true"])
    b = as_["bob"].submit(name="b", command=["true"])
    t = as_["team"].submit(name="t", command=["true"])
    assert (a.user, b.user, t.user) == ("alice", "bob", None)
    assert c.submit(name="l", team="prod", command=["true"]).user == c.principal.id  # the login
    assert [j.id for j in as_["bob"].list(user="alice")] == [a.id]  # a member reads its team's
    assert {e.job_id for e in c.events(user="alice")} == {a.id}
    assert [e.actor for e in c.events(a.id)] == [f"token:{ALICE.id} (research member alice)"]
    assert as_["carol"].list(user="alice") == []  # another team's person: nothing to see


def test_who_may_change_a_job(home):
    _, _, as_ = home
    j = as_["alice"].submit(name="a", command=["true"]).id
    with pytest.raises(Forbidden, match="submitted by alice; ask them, the team lead or an admin"):
        as_["bob"].hold(j)
    with pytest.raises(Forbidden, match="team lead's or an admin token"):
        as_["alice"].set_budget(5.0, job_id=j)
    with pytest.raises(NotFound, match=f"no job with id {j}"):
        as_["carol"].update(j, priority="low")
    assert as_["alice"].update(j, priority="high").priority == "high"
    assert as_["team"].hold(j).held_by == f"token:{TEAM.id} (research member)"
    assert as_["lead"].release(j).held_by is None
    assert "budget set" in as_["lead"].set_budget(5.0, job_id=j)
    with pytest.raises(Forbidden):
        as_["bob"].cancel(j)
    assert as_["alice"].cancel(j).status == "CANCELLED"
    with pytest.raises(InvalidState, match="already ended"):
        as_["alice"].release(j)


def test_update_follows_the_submit_budget_rules(home):
    """2 GPUs x 1 h: $7.20 on-prem, $2.00 on spot."""
    c, _, as_ = home
    j = as_["alice"].submit(name="a", command=["true"], gpus_per_node=2, expected_duration_s=3600.0,
                            spot="never").id
    with pytest.raises(BudgetError, match=r"estimated cost \$7.20 exceeds its budget \$5.00"):
        as_["alice"].update(j, budget_usd=5.0)
    assert c.get(j).budget_usd is None  # nothing written
    k = as_["alice"].submit(name="b", command=["true"], gpus_per_node=2, expected_duration_s=3600.0).id
    info = as_["alice"].update(k, budget_usd=5.0)
    assert (info.budget_usd, info.spot) == (5.0, "only")  # as a submit: queued spot-only
    assert [e.kind for e in c.events(k)][-2:] == ["spot_only", "budget_set"]


def test_a_budget_stopped_job_resumes_when_its_submitter_raises_its_budget(home):
    c, _, as_ = home
    j = as_["alice"].submit(name="a", command=["true"], budget_usd=1.0).id
    with c.store.session() as s:  # as the broker leaves it: stopped, having spent $3
        row = s.get(Job, j)
        assert row is not None
        row.state = JobState.BUDGET_EXHAUSTED
        s.add(LedgerEntry(kind="gpu", pool="a100", team="research", job_id=j, start=0.0, end=1.0,
                          usd=3.0))
    with pytest.raises(InvalidState, match="already spent"):
        as_["alice"].update(j, budget_usd=2.0)
    assert as_["alice"].update(j, budget_usd=10.0).status == "PENDING"


def test_a_held_job_is_never_placed_and_says_why(home):
    c, eng, as_ = home
    j = as_["alice"].submit(name="a", team="research", command=train(2), gpus_per_node=2).id
    as_["alice"].hold(j)
    eng.cycle()
    eng.cycle()
    info = c.get(j)
    assert info.status == "PENDING" and info.attempts == 0
    assert info.waiting_reason == (f"on hold (by token:{ALICE.id} (research member alice)): never "
                                   f"placed until `onepool release {j}`")
    as_["alice"].release(j)
    drive(eng, lambda: c.get(j).status == "RUNNING")
    with pytest.raises(InvalidState, match="is running: a hold keeps waiting jobs from starting"):
        as_["alice"].hold(j)
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    kinds = [(e.kind, e.actor) for e in c.events(j) if e.kind in ("held", "released")]
    assert kinds == [("held", ALICE.actor), ("released", ALICE.actor)]


def test_each_change_wakes_the_broker(home):
    c, _, as_ = home
    j = as_["alice"].submit(name="a", command=["true"]).id
    pokes: list[int] = []
    remove = c.store.wake.listen(lambda: pokes.append(1))
    try:
        as_["alice"].update(j, priority="low")
        as_["alice"].hold(j)
        as_["alice"].release(j)
    finally:
        remove()
    assert len(pokes) == 3


@pytest.mark.parametrize(("allowance", "placed_as"), [(0, "normal"), (2, "urgent")])
def test_a_raised_priority_goes_through_the_urgent_allowance_at_placement(make_cluster, allowance: int,
                                                                         placed_as: str):
    """The allowance is counted at placement, for a submitted class as for an updated one."""
    c, eng = make_cluster(pools=[ONPREM], teams=[{"name": "research", "priority_allowance_gpus": allowance},
                                                 {"name": "prod"}])
    alice = Client(store=c.store, clock=c.clock, principal=ALICE)
    j = alice.submit(name="a", command=train(2), gpus_per_node=2).id
    alice.hold(j)
    eng.cycle()
    alice.update(j, priority="urgent")
    alice.release(j)
    drive(eng, lambda: c.get(j).attempts == 1)
    assert (c.get(j).priority, c.get(j).attempt_list[0].priority) == ("urgent", placed_as)


def test_cost_and_lost_work_by_user_and_what_a_member_sees(home):
    """alice's job preempted carol's (2 GPU-hours lost); each was charged. Cost by user keys
    each person under its team; lost work is charged to the preempting person. carol (prod)
    sees her own team's people only."""
    c, _, as_ = home
    a = as_["alice"].submit(name="a", command=["true"]).id
    b = as_["carol"].submit(name="b", command=["true"]).id
    t = as_["team"].submit(name="t", command=["true"]).id
    with c.store.session() as s:
        s.add(Attempt(job_id=b, number=1, pool="a100", alloc=[["a100-0", [0]]], priority="normal",
                      started_at=0.0, ended_at=10.0, gpus=1, state=AttemptState.ENDED,
                      end_reason="PREEMPTED", preempted_by=a, lost_gpu_s=7200.0))
        for job, team, usd in ((a, "research", 3.0), (b, "prod", 2.0), (t, "research", 1.0)):
            s.add(LedgerEntry(kind="gpu", pool="a100", team=team, job_id=job, experiment="default",
                              start=0.0, end=10.0, usd=usd))
    assert {r.key: r.usd for r in c.costs("user")} == {
        "research/alice": 3.0, "prod/carol": 2.0, "research/(team token)": 1.0}
    assert [(r.key, r.lost_gpu_hours, r.victims) for r in c.lost_work("user")] == [
        ("research/alice", 2.0, [b])]
    assert [r.key for r in as_["carol"].costs("user")] == ["prod/carol"]
    assert as_["carol"].lost_work("user") == []
    assert [r.key for r in as_["bob"].lost_work("user")] == ["research/alice"]

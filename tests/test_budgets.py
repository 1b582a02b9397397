"""Budgets: refused or spot-only at submission, BUDGET_EXHAUSTED and resume, team windows."""

from __future__ import annotations

import pytest

from broker.client.sdk import Client
from broker.control import budgets
from broker.errors import InvalidState
from broker.policy import PendingView, PoolView, Snapshot, TeamView
from broker.spec import Priority, SpotPolicy
from broker.state.model import LedgerEntry
from tests.conftest import drive, train

pytestmark = pytest.mark.both_dbs

ONPREM = {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "price_per_node_hour": 7.2}
SPOT = {"name": "spot", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "market": "spot",
        "price_per_node_hour": 2.0}


@pytest.mark.parametrize(("pools", "broker", "spec", "outcome"), [
    # 2 GPUs x 1 h at $3.60/GPU-h = $7.20 against a $5 budget
    ([ONPREM], {}, {}, "refused"),
    ([ONPREM, SPOT], {"over_budget_submission": "refuse"}, {}, "refused"),
    ([ONPREM, SPOT], {}, {"spot": "never"}, "refused"),
    ([ONPREM, SPOT], {}, {}, "spot_only"),  # $2.00 on spot fits
    ([ONPREM], {}, {"budget_usd": 8.0}, "accepted"),
    ([ONPREM], {}, {"expected_duration_s": None}, "accepted"),  # nothing to estimate from
])
def test_submission_estimate_against_budget(make_cluster, pools, broker, spec, outcome):
    c, _ = make_cluster(pools=pools, **broker)
    job = {"name": "j", "team": "research", "command": ["true"], "gpus_per_node": 2,
           "budget_usd": 5.0, "expected_duration_s": 3600.0, **spec}
    if outcome == "refused":
        with pytest.raises(budgets.BudgetError) as e:
            c.submit(job)
        assert "estimated cost $7.20 exceeds its budget $5.00" in str(e.value)
        assert "raise --budget-usd to at least 7.20" in str(e.value)
        assert c.list() == []
        return
    info = c.submit(job)
    notes = [e.message for e in c.events(info.id) if e.kind == "budget_spot_only"]
    assert info.spot == ("only" if outcome == "spot_only" else spec.get("spot", "allowed"))
    assert notes == (["queued spot-only: the estimate $7.20 on a100 exceeds the budget $5.00; "
                      "on spot pool spot it is $2.00"] if outcome == "spot_only" else [])


@pytest.mark.parametrize(("budget", "seconds", "says"), [
    (0.0, 1.0, ["estimated cost $0.0020 exceeds its budget $0.00 (a budget of $0 allows no spending",
                "at least 0.01"]),
    (0.001, 1.0, ["estimated cost $0.0020 exceeds its budget $0.0010", "at least 0.01"]),
    (5.0, 3600.0, ["estimated cost $7.20 exceeds its budget $5.00", "at least 7.20"]),
])
def test_refusals_show_small_amounts_as_they_are(make_cluster, budget, seconds, says):
    """Never "estimated $0.00 exceeds its budget $0.00": small amounts keep two significant digits."""
    c, _ = make_cluster(pools=[ONPREM])
    with pytest.raises(budgets.BudgetError) as e:
        c.submit(name="j", team="research", command=["true"], gpus_per_node=2, budget_usd=budget,
                 expected_duration_s=seconds)
    for text in says:
        assert text in str(e.value)


@pytest.mark.parametrize("amount", [-10.0, -0.01])
def test_a_negative_budget_is_a_spec_error_naming_the_amount(make_cluster, amount):
    from broker.errors import SpecError

    c, _ = make_cluster(pools=[ONPREM])
    j = c.submit(name="j", team="research", command=["true"]).id
    for kw in ({"job_id": j}, {"team": "research"}):
        with pytest.raises(SpecError, match="amount: must be a finite number of USD >= 0"):
            c.set_budget(amount, **kw)


def test_estimate_uses_the_teams_history_for_the_experiment(make_cluster, clock):
    c, eng = make_cluster(pools=[ONPREM])
    done = c.submit(name="first", team="research", experiment="exp", command=train(2), gpus_per_node=2).id
    eng.cycle()
    clock.advance(3600)
    drive(eng, lambda: c.get(done).status == "SUCCEEDED")
    with pytest.raises(budgets.BudgetError, match=r"\$7\.20 exceeds its budget \$1\.00.*mean of team "
                       r"research's finished exp jobs"):
        c.submit(name="second", team="research", experiment="exp", command=["true"], gpus_per_node=2,
                 budget_usd=1.0)


def _charge_team(c: Client, team: str, usd: float, at: float) -> None:
    with c.store.session() as s:
        s.add(LedgerEntry(kind="gpu", pool="a100", team=team, start=at, end=at, usd=usd))


def test_team_low_on_budget_goes_spot_only_and_exhausted_is_refused(make_cluster, clock):
    teams = [{"name": "research", "budget_usd": 10.0, "budget_window": "month"},
             {"name": "prod", "priority_allowance_gpus": 8}]
    c, eng = make_cluster(pools=[{**ONPREM, "market": "on_demand"}, SPOT], teams=teams)
    _charge_team(c, "research", 8.5, clock.now())  # 15% left < 20%: low
    assert {b.team: b.state for b in c.budgets()} == {"research": "low", "prod": "none"}
    j = c.submit(name="j", team="research", command=train(2), gpus_per_node=2, priority="urgent").id
    eng.cycle()
    info = c.get(j)
    assert info.status == "RUNNING" and info.attempt_list[0].pool == "spot"
    assert info.attempt_list[0].priority == "normal"  # its urgent allowance is gone
    assert [e.kind for e in c.events() if e.kind.startswith("team_budget")] == ["team_budget_low"]
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    _charge_team(c, "research", 2.0, clock.now())
    with pytest.raises(budgets.BudgetError, match=r"team research has spent \$10\.50 of its \$10\.00 month"):
        c.submit(name="k", team="research", command=["true"])
    assert "spent $10.50" in c.set_budget(100.0, team="research")
    assert c.submit(name="k", team="research", command=["true"]).status == "PENDING"


def test_restrict_is_pure_and_table_driven():
    snap = Snapshot(now=0.0, pools=(PoolView("p", "A100", 2, ()),),
                    pending=(PendingView(1, "a", Priority.URGENT, 1, 0.0),
                             PendingView(2, "b", Priority.LOW, 1, 0.0),
                             PendingView(3, "c", Priority.LOW, 1, 0.0)),
                    teams=(TeamView("a", priority_allowance_gpus=4), TeamView("b"), TeamView("c")))
    tb = [budgets.TeamBudget(t, 1.0, "month", 0.0, None, 0.0, st, 0.2)
          for t, st in (("a", "low"), ("b", "exhausted"), ("c", "ok"))]
    out = budgets.restrict(snap, tb)
    assert [(p.job_id, p.spot) for p in out.pending] == [(1, SpotPolicy.ONLY), (3, SpotPolicy.ALLOWED)]
    assert [t.priority_allowance_gpus for t in out.teams] == [0, 0, TeamView("c").priority_allowance_gpus]
    assert snap.pending[0].spot is SpotPolicy.ALLOWED  # the input is untouched


@pytest.mark.parametrize(("window", "now", "start", "end"), [
    ("day", "2026-12-02T18:30:00", "2026-12-02T00:00:00", "2026-12-03T00:00:00"),
    ("week", "2026-12-02T18:30:00", "2026-11-30T00:00:00", "2026-12-07T00:00:00"),
    ("month", "2026-12-02T18:30:00", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
    ("month", "2026-02-28T23:59:59", "2026-02-01T00:00:00", "2026-03-01T00:00:00"),
])
def test_window_bounds_are_utc_calendar_windows(window, now, start, end):
    from datetime import UTC, datetime

    def ts(x: str) -> float:
        return datetime.fromisoformat(x).replace(tzinfo=UTC).timestamp()

    assert budgets.window_bounds(window, ts(now)) == (ts(start), ts(end))


@pytest.mark.e2e
def test_job_over_budget_checkpoints_stops_and_resumes_when_raised(make_cluster, clock):
    """$1 per GPU-second: a 2-GPU job with a $30 budget is stopped 20 s of broker time in, after a
    final checkpoint; raising the budget resumes it from that checkpoint to completion."""
    expensive = {**ONPREM, "price_per_node_hour": 7200.0}
    c, eng = make_cluster(pools=[expensive])
    # A first checkpoint after 0.5 s, then 5.5 s more to run: the stop comes long before the end.
    j = c.submit(name="pricey", team="research", command=train(120, step_s=0.05, ckpt_every=10),
                 gpus_per_node=2, budget_usd=30.0).id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 0)
    assert c.get(j).status == "RUNNING"
    clock.advance(20)  # $40 of GPU time: over budget at the next cycle
    drive(eng, lambda: c.get(j).status == "BUDGET_EXHAUSTED")
    info = c.get(j)
    first = info.attempt_list[0]
    assert first.end_reason == "BUDGET" and first.cause == "budget"
    assert first.reached_step is not None and first.reached_step > 0, "a final checkpoint on stop"
    assert c.costs("job")[0].usd == pytest.approx(40.0)
    kinds = [e.kind for e in c.events(j)]
    assert "budget_stop" in kinds and kinds[-1] == "budget_exhausted"
    with pytest.raises(InvalidState, match="already spent"):
        c.set_budget(35.0, job_id=j)
    assert "back in the queue" in c.set_budget(100.0, job_id=j)
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    second = c.get(j).attempt_list[1]
    assert second.restored_step == first.reached_step and second.end_reason == "COMPLETED"


def test_with_budgets_enforced_as_a_task_the_ledger_is_charged_every_cycle(make_cluster, clock):
    """Duties scheduled (the leader's loop): every cycle charges the ledger, but only the
    enforce_budgets task stops a job over its budget; it does, at its next run."""
    expensive = {**ONPREM, "price_per_node_hour": 7200.0}  # $1 per GPU-second
    c, eng = make_cluster(pools=[expensive])
    eng.duties_scheduled = True
    j = c.submit(name="pricey", team="research", command=train(4000, step_s=0.05),
                 gpus_per_node=2, budget_usd=30.0).id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    clock.advance(20)
    eng.cycle()
    assert c.costs("job")[0].usd == pytest.approx(40.0)  # charged by the cycle
    assert c.get(j).attempt_list[0].state == "RUNNING"  # over budget, not yet enforced
    eng.enforce_budgets(clock.now())  # the task's run
    assert c.get(j).attempt_list[0].state == "STOPPING"
    drive(eng, lambda: c.get(j).status == "BUDGET_EXHAUSTED")
    assert c.get(j).attempt_list[0].end_reason == "BUDGET"
    assert "budget_stop" in [e.kind for e in c.events(j)]



@pytest.mark.e2e
def test_cancel_of_a_budget_stopped_job_ends_it(make_cluster, clock):
    expensive = {**ONPREM, "price_per_node_hour": 7200.0}
    c, eng = make_cluster(pools=[expensive])
    j = c.submit(name="pricey", team="research", command=train(120, step_s=0.05, ckpt_every=10),
                 gpus_per_node=2, budget_usd=30.0).id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    clock.advance(20)
    drive(eng, lambda: c.get(j).status == "BUDGET_EXHAUSTED")
    assert c.cancel(j).status == "CANCELLED"
    with pytest.raises(InvalidState, match="already ended"):
        c.cancel(j)


def test_team_budget_spent_stops_its_running_work_and_raising_it_resumes_it(make_cluster, clock):
    """Issue 28 part 5: at $1 per GPU-second, a team with a $30 month budget whose 2-GPU job
    runs 20 s of broker time has spent $40: the job checkpoints and stops as BUDGET_EXHAUSTED
    (the team's budget, not its own: it has none), new work of the team is refused; raising the
    team's budget puts it back in the queue and it finishes from that checkpoint."""
    teams = [{"name": "research", "budget_usd": 30.0, "budget_window": "month"}, {"name": "prod"}]
    c, eng = make_cluster(pools=[{**ONPREM, "price_per_node_hour": 7200.0}], teams=teams)
    j = c.submit(name="team-paid", team="research", command=train(60, step_s=0.02, ckpt_every=5),
                 gpus_per_node=2).id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 0)
    clock.advance(20)
    drive(eng, lambda: c.get(j).status == "BUDGET_EXHAUSTED")
    first = c.get(j).attempt_list[0]
    assert first.end_reason == "BUDGET" and (first.reached_step or 0) > 0, "a final checkpoint on stop"
    assert {b.team: b.state for b in c.budgets()}["research"] == "exhausted"
    stops = [e.message for e in c.events(j) if e.kind == "budget_stop"]
    assert stops and "team research's budget is spent" in stops[0]
    assert "team_budget_exhausted" in [e.kind for e in c.events()]
    with pytest.raises(budgets.BudgetError, match="team research has spent"):
        c.submit(name="more", team="research", command=["true"])
    eng.cycle()  # still stopped: nothing of an exhausted team is placed
    assert c.get(j).status == "BUDGET_EXHAUSTED"
    assert f"back in the queue: jobs {j}" in c.set_budget(1000.0, team="research")
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    second = c.get(j).attempt_list[1]
    assert second.restored_step == first.reached_step and second.end_reason == "COMPLETED"
    total = sum(r.usd for r in c.costs("team"))  # issue 28: the user view sums to the same total
    assert sum(r.usd for r in c.costs("user")) == pytest.approx(total)
    assert {r.key for r in c.costs("user") if r.jobs} == {f"research/{c.principal.id}"}

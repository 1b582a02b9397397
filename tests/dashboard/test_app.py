"""The dashboard under streamlit.testing.v1.AppTest on a seeded home: every tab renders, and its
numbers equal the query functions' (and the SDK's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.tabs import JOB_KEY, TABS, job_link
from tests.dashboard.seed import seed

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture(autouse=True)
def _loopback():  # type: ignore[no-untyped-def]
    """As `onepool dashboard` runs it: on 127.0.0.1 (the embedded mode asks no token there)."""
    from streamlit import config

    before = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    yield
    config.set_option("server.address", before)


@pytest.fixture
def app(tmp_path, monkeypatch):
    c = seed(tmp_path / "home")
    monkeypatch.setenv("ONEPOOL_HOME", str(c.store.home))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, at.exception
    return c, at


def _tab(at: AppTest, name: str):  # type: ignore[no-untyped-def]
    return at.tabs[TABS.index(name)]


def _frame(at: AppTest, tab: str, i: int):  # type: ignore[no-untyped-def]
    """The i-th table (st.dataframe) on a tab, as a DataFrame."""
    return _tab(at, tab).dataframe[i].value


def test_tabs(app):
    _, at = app
    assert [t.label for t in at.tabs] == TABS


def test_overview_is_as_of_now(app):
    """What runs and waits now, not at the last sample: one job running on 1 GPU, one waiting."""
    c, at = app
    m = {x.label: x.value for x in _tab(at, "Overview").metric}
    assert (m["GPUs in use now"], m["jobs running now"], m["jobs waiting now"]) == ("1", "1", "1")
    assert m["GPUs free now"] == str(sum(p.free_gpus for p in c.pools())) == "5"
    assert m["total spent (USD)"] == f"{sum(r.usd for r in c.costs('pool')):.2f}"
    last_hour = sum(r.usd for r in c.costs("pool", c.clock.now() - 3600))
    # The app's "now" is the system clock, a few seconds after the seed's: at ~$19/h that moves
    # the last hour's spend by about a cent per two seconds.
    assert float(m["burn rate (USD/h)"]) == pytest.approx(last_hour, abs=0.2)
    assert 0 < last_hour < sum(r.usd for r in c.costs("pool"))  # not the total
    assert [h.value for h in _tab(at, "Overview").subheader] == ["GPUs in use by pool and class",
                                                                 "jobs waiting by class"]


def test_cost_table_equals_costs_by_experiment_with_unused_rows(app):
    c, at = app
    table = _tab(at, "Cost per experiment").table[0].value
    rows = c.costs("experiment")
    assert list(table["experiment"]) == [r.key for r in rows]
    assert {"lr-sweep", "release", "idle on-prem", "idle rented"} <= set(table["experiment"])
    assert list(table["usd"]) == [round(r.usd, 4) for r in rows]
    assert round(table["usd"].sum(), 2) == round(sum(r.usd for r in c.costs("pool")), 2)
    assert list(table["lost_gpu_hours"]) == [round(r.lost_gpu_hours, 4) for r in rows]


def test_cost_per_user_equals_costs_by_user(app):
    """Issue 28: each person's jobs (alice's sweep; the rest by team tokens) with what they cost."""
    c, at = app
    table = _tab(at, "Cost per experiment").table[1].value
    rows = [r for r in c.costs("user") if r.jobs]
    assert list(table["user"]) == [r.key for r in rows]
    assert "research/alice" in set(table["user"])
    assert list(table["usd"]) == [round(r.usd, 4) for r in rows]
    jobs_tab = _tab(at, "Jobs")
    assert jobs_tab.selectbox[0].label == "user"
    at.selectbox(key="jobs_user").select("alice").run()
    sweep = {j.id for j in c.list() if j.user == "alice"}
    assert sweep and {int(o.split(":")[0]) for o in at.selectbox(key=JOB_KEY).options} == sweep


def test_experiment_drill_down_to_jobs_and_attempts(app):
    c, at = app
    jobs = _frame(at, "Cost per experiment", 0)
    assert set(jobs["name"]) == {"sweep-0", "sweep-1", "sweep-2"}
    by_job = {r.key: r.usd for r in c.costs("job")}
    assert {str(j): round(u, 6) for j, u in zip(jobs["job"], jobs["usd"], strict=True)} == \
        {k: round(v, 6) for k, v in by_job.items() if k in {str(j) for j in jobs["job"]}}
    attempts = _frame(at, "Cost per experiment", 1)
    assert list(attempts["pool"]) == ["a100", "spot"] and attempts["started_at"][0].count(":") == 2
    at.selectbox(key="experiment").select("release").run()
    assert list(_frame(at, "Cost per experiment", 0)["name"]) == ["hotfix", "eval"]


def test_job_page_shows_attempts_progress_and_money(app):
    c, at = app
    m = {x.label: x.value for x in _tab(at, "Jobs").metric}
    running = next(j for j in c.list() if j.status == "RUNNING")
    assert (m["status"], m["step"]) == ("RUNNING", "40 of 100")
    assert m["spent (USD)"] == f"{dict((r.key, r.usd) for r in c.costs('job'))[str(running.id)]:.4f}"
    att = _frame(at, "Jobs", 1)
    assert list(att["why"]) == ["spot_interruption", ""] and list(att["pool"]) == ["spot", "a100"]
    assert list(att["nodes"]) == ["spot-0[0,1]", "a100-1[1]"]
    assert list(att["restart"]) == ["", "fetch code 0.25 s, pull image 3.00 s, setup 0.01 s (cached), "
                                        "first progress 6.50 s"]


def test_preemptions_include_zero_loss_and_who_caused_them(app):
    _, at = app
    df = _frame(at, "Preemptions", 0)
    assert sorted(df["cause"]) == ["preempted", "spot_interruption"]
    assert sorted(df["lost_gpu_hours"].round(4)) == [0.0, round(600 / 3600, 4)]
    assert list(df.loc[df["cause"] == "preempted", "caused_by_team"]) == ["prod"]
    m = {x.label: x.value for x in _tab(at, "Preemptions").metric}
    assert (m["interruptions"], m["with no work lost"]) == ("2", "1")


def test_nodes_and_pools(app):
    c, at = app
    pools = _frame(at, "Nodes & pools", 0)
    assert list(pools["pool"]) == ["a100", "spot"]
    assert list(pools["free_gpus"]) == [p.free_gpus for p in c.pools()] == [3, 2]
    assert list(pools["usd_per_gpu_hour"]) == [4.0, 1.5]
    nodes = _frame(at, "Nodes & pools", 1)
    assert list(nodes["node"]) == ["a100-0", "a100-1", "spot-0"]
    assert list(nodes["jobs"]) == ["", str(next(j.id for j in c.list() if j.status == "RUNNING")), ""]


def test_budgets(app):
    c, at = app
    df = _frame(at, "Budgets", 0)
    research = df[df["team"] == "research"].iloc[0]
    assert research["budget_usd"] == 50.0
    assert research["spent_usd"] == pytest.approx(next(b.spent for b in c.budgets() if b.team == "research"))
    assert [h.value for h in _tab(at, "Budgets").subheader] == ["team budgets"]


def test_rebalancing_shows_each_move_with_expected_and_realized_saving(app):
    from broker.state.events import record
    from dashboard import queries

    c, _ = app
    t = c.clock.now()
    with c.store.session() as s:  # one move done, one given up (as broker.control.rebalancer records them)
        record(s, t - 900, "rebalance_move", "...", job_id=1, from_pool="spot", to_pool="a100",
               reason="on-demand to freed on-prem", saving_usd=10.0, cost_usd=1.0)
        record(s, t - 800, "rebalance_moved", "...", job_id=1)
        record(s, t - 100, "rebalance_realized", "...", job_id=1, realized_saving_usd=7.5)
        record(s, t - 50, "rebalance_move", "...", job_id=2, from_pool="spot", to_pool="a100",
               reason="spot to cheaper spot", saving_usd=4.0, cost_usd=2.0)
        record(s, t - 40, "rebalance_abandoned", "...", job_id=2, why="no checkpoint committed")
        s.commit()
        rows = queries.rebalance_moves(s)
    assert [(r["job"], r["state"], r["realized_saving_usd"]) for r in rows] == [
        (2, "abandoned: no checkpoint committed", None), (1, "done", 7.5)]
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, at.exception
    df = _frame(at, "Rebalancing", 0)
    assert list(df["job"]) == [job_link(2), job_link(1)] and list(df["expected_saving_usd"]) == [4.0, 10.0]
    m = {x.label: x.value for x in _tab(at, "Rebalancing").metric}
    assert (m["moves"], m["expected net saving ($)"], m["realized saving ($)"]) == ("2", "11.00", "7.50")


def test_job_page_shows_gpu_utilization_and_held_but_idle(tmp_path, monkeypatch):
    """The running job's attempt sampled at 2% for 11 minutes (broker.utilization); and (issue
    31) its deadline and the checkpoint interval advised at its start, as `onepool status`."""
    import time

    from sqlmodel import select

    from broker.policy.intervals import Advice
    from broker.state.model import Attempt, Job

    c = seed(tmp_path / "home")
    with c.store.session() as s:
        a = s.exec(select(Attempt).where(Attempt.ended_at == None)).first()  # noqa: E711
        assert a is not None
        a.gpu_util_pct, a.gpu_util_mean_pct, a.gpu_util_at = 2.0, 3.0, time.time()
        a.gpu_idle_since = time.time() - 660
        s.add(a)
        j = s.get(Job, a.job_id)
        assert j is not None
        j.checkpoint_advice = Advice(600.0, 10.0, 0.5, "measured").to_record(time.time())
        j.deadline, j.deadline_where = 1796580000.0, "safe"
        s.add(j)
        s.commit()
    monkeypatch.setenv("ONEPOOL_HOME", str(c.store.home))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, at.exception
    job = _tab(at, "Jobs")
    assert any("GPU utilization 2%" in x.value for x in job.caption)
    assert any("held but idle" in w.value for w in job.warning)
    assert any(x.value.startswith("deadline: 2026-12-06 18:00:00 UTC; runs on capacity that will not be")
               for x in job.caption)
    assert any("advised 600 s from a save of 10.0 s" in x.value for x in job.caption)
    att = _frame(at, "Jobs", 1)
    assert list(att["gpu_util_pct"].dropna()) == [2.0]


def test_job_page_shows_the_estimate_of_a_waiting_job(app):
    """Issue 29: beside a pending job, the same estimate as `onepool status --estimate`."""
    c, at = app
    waiting = next(j for j in c.list() if j.status == "PENDING")
    at.selectbox(key="job").select(waiting.id).run()
    captions = [x.value for x in _tab(at, "Jobs").caption]
    assert any(t.startswith("estimate: pool a100 (A100, onprem); starts in") for t in captions), captions


def test_replay_tab_replays_the_history_under_changed_settings(app):
    """The Replay tab runs `onepool replay` (the SDK's replay) and shows its comparison; a bad
    setting names the field."""
    from broker.sim.compare import table

    c, at = app
    tab = _tab(at, "Replay")
    tab.text_area(key="replay_sets").input("broker.grace_seconds=5")
    tab.button(key="replay_go").click()
    at.run()
    assert "broker.grace_seconds: unknown field" in _tab(at, "Replay").error[0].value
    _tab(at, "Replay").text_area(key="replay_sets").input("teams.prod.weight=4")
    _tab(at, "Replay").button(key="replay_go").click()
    at.run()
    assert not at.exception, at.exception
    shown = _frame(at, "Replay", 0)
    want = table(c.replay(["teams.prod.weight=4"]))
    assert list(shown["what"]) == [r["what"] for r in want]
    # the app's "now" is the system clock, seconds after this one: running jobs have run longer
    assert list(shown["current"].fillna(-1)) == pytest.approx(
        [-1 if r["current"] is None else r["current"] for r in want], rel=0.05, abs=10)

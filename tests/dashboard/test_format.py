"""Table tests of what the dashboard shows around its data: 24-hour time axes, links into a tab
and a job, and a team budget's override counting only from when it was set."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from broker.control.budgets import set_team_budget
from dashboard import queries
from dashboard.sections import axis_format
from dashboard.tabs import link, wanted_job
from tests.dashboard.seed import SPAN_S, seed

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
AFTERNOON = datetime(2026, 12, 4, 17, 26, 5)


@pytest.mark.parametrize(("span_s", "shown"), [
    (600, "17:26"), (3600, "17:26"), (86400, "17:26"),  # 17:26, never 05:26 (a 12-hour clock)
    (86401, "04 Dec 17:26"), (7 * 86400, "04 Dec 17:26"),  # past a day: the day too
])
def test_time_axes_use_a_24_hour_clock(span_s: float, shown: str) -> None:
    assert AFTERNOON.strftime(axis_format(span_s)) == shown  # d3's %H %M %d %b are strftime's


@pytest.mark.parametrize(("tab", "job", "url"), [
    ("Jobs", 12, "?tab=Jobs&job=12"),
    ("Jobs", None, "?tab=Jobs"),
    ("Budgets", None, "?tab=Budgets"),
    ("Cost per experiment", None, "?tab=Cost+per+experiment"),
    ("Nodes & pools", None, "?tab=Nodes+%26+pools"),
])
def test_links_open_a_tab_and_a_job(tab: str, job: int | None, url: str) -> None:
    assert link(tab, job) == url


@pytest.mark.parametrize(("tab", "job", "message"), [
    ("Job", None, "tab: must be one of Overview, Cost per experiment, Jobs,"),
    ("jobs", 3, "tab: must be one of"),
    ("Budgets", 3, "job: only the Jobs tab shows one job (got tab 'Budgets')"),
])
def test_a_link_to_no_tab_is_refused_naming_the_tabs(tab: str, job: int | None, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        link(tab, job)


@pytest.mark.parametrize(("params", "job"), [
    ({"job": "12"}, 12), ({"tab": "Jobs"}, None), ({"job": "x"}, None), ({"job": "0"}, None),
    ({"job": "-3"}, None), ({"job": "1" * 30}, None), ({"job": ""}, None),
])
def test_the_job_a_link_asks_for(params: dict[str, str], job: int | None) -> None:
    assert wanted_job(params) == job


def test_the_charts_time_axis_is_24_hour_on_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chart of the Overview and Budgets tabs formats its time axis itself (Vega's default
    is a 12-hour clock: 17:26 drawn as 05:26)."""
    c = seed(tmp_path / "home")
    monkeypatch.setenv("ONEPOOL_HOME", str(c.store.home))
    before = st_config.get_option("server.address")
    st_config.set_option("server.address", "127.0.0.1")
    try:
        at = AppTest.from_file(str(APP), default_timeout=60).run()
    finally:
        st_config.set_option("server.address", before)
    assert not at.exception, at.exception
    specs = [json.loads(n.proto.spec) for i in (0, 5) for n in at.tabs[i].children.values()
             if type(n).__name__ == "UnknownElement" and hasattr(n.proto, "spec")]
    assert len(specs) == 3  # GPUs in use, jobs waiting, research's budget
    assert [s["encoding"]["x"]["axis"]["format"] for s in specs] == ["%H:%M"] * 3


@pytest.mark.parametrize(("at_s", "budget"), [
    (0, 50.0), (1800, 50.0), (2699, 50.0),  # the configured budget until the override ...
    (2700, 80.0), (4000, 80.0), (SPAN_S, 80.0),  # ... which counts from when it was set
])
def test_a_budget_override_counts_from_when_it_was_set(tmp_path: Path, at_s: float, budget: float) -> None:
    c = seed(tmp_path / "home")
    now = c.clock.now()
    t0 = now - SPAN_S
    with c.store.session() as s:
        set_team_budget(s, c.config(), "research", 80.0, t0 + 2700)
        s.commit()
        rows = queries.burndown(s, "research", now)
        changes = queries.budget_changes(s, "research", 50.0)
    assert queries.budget_at(changes, t0 + at_s) == budget
    row = min(rows, key=lambda r: abs(r["t"] - (t0 + at_s)))
    if abs(row["t"] - (t0 + at_s)) < 1:  # a sampled point (the start, the override, now)
        assert row["budget_usd"] == budget
    assert any(r["t"] == t0 + 2700 and r["budget_usd"] == 80.0 for r in rows)  # drawn from that moment
    i = next(i for i, r in enumerate(rows) if r["t"] == t0 + 2700)
    assert rows[i]["left_usd"] - rows[i - 1]["left_usd"] > 25  # 30 more to spend from that moment on
    before = [r for r in rows if r["t"] < t0 + 2700]
    assert before and all(r["budget_usd"] == 50.0 for r in before)

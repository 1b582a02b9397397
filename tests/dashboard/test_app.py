"""The dashboard under streamlit.testing.v1.AppTest on a seeded home: numbers equal the queries'."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboard.seed import seed

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture
def app(tmp_path, monkeypatch):
    c = seed(tmp_path / "home")
    monkeypatch.setenv("ONEPOOL_HOME", str(c.store.home))
    at = AppTest.from_file(str(APP), default_timeout=30).run()
    assert not at.exception, at.exception
    return c, at


def test_cost_table_equals_costs_by_experiment(app):
    c, at = app
    table = at.table[0].value
    rows = c.costs("experiment")
    assert list(table["experiment"]) == [r.key for r in rows] == ["lr-sweep", "release"]
    assert list(table["usd"]) == [round(r.usd, 4) for r in rows]
    assert list(table["jobs"]) == [r.jobs for r in rows]
    assert list(table["lost_gpu_hours"]) == [round(r.lost_gpu_hours, 4) for r in rows]


def test_overview_total_and_drill_down(app):
    c, at = app
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["total spent (USD)"] == f"{sum(r.usd for r in c.costs('pool')):.2f}"
    jobs = at.dataframe[0].value
    assert set(jobs["name"]) == {"sweep-0", "sweep-1"}
    by_job = {r.key: r.usd for r in c.costs("job")}
    assert {str(j): round(u, 6) for j, u in zip(jobs["job"], jobs["usd"], strict=True)} == \
        {k: round(v, 6) for k, v in by_job.items() if k in {str(j) for j in jobs["job"]}}
    at.selectbox(key="experiment").select("release").run()
    assert list(at.dataframe[0].value["name"]) == ["hotfix"]


@pytest.mark.parametrize(("tab", "must_show"), [
    (2, "team budgets"), (3, "lost GPU-hours by cause"), (4, "pools and prices")])
def test_every_section_renders(app, tab, must_show):
    _, at = app
    assert must_show in [h.value for h in at.tabs[tab].subheader]

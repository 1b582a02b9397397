"""The dashboard over the API (ONEPOOL_URL) with a token, under streamlit.testing.v1.AppTest,
against a real API server (uvicorn on 127.0.0.1) on a seeded home: a member sees its own
team's jobs, logs and money only, an admin every team; no token: the login page; a link opens
a tab and a job. Also the embedded mode off loopback: a token first."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pandas as pd
import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from broker.api.app import create_app
from broker.client.sdk import Client
from broker.clock import SystemClock
from dashboard.tabs import TABS
from tests.agents.harness import ApiServer, serve
from tests.dashboard.seed import seed

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@dataclass
class Lab:
    c: Client  # the server's own embedded client (seeded)
    api: ApiServer
    tokens: dict[str, str]  # admin, research (a member), prod (a member)

    def ids(self, team: str | None = None) -> set[int]:
        return {j.id for j in self.c.list() if team is None or j.team == team}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    c = seed(tmp_path / "home")
    tokens = {"admin": c.create_token("research", "admin").token or "",
              "research": c.create_token("research").token or "", "prod": c.create_token("prod").token or ""}
    api = serve(create_app(c.store, SystemClock()))
    try:
        yield Lab(c, api, tokens)
    finally:
        api.stop()


@pytest.fixture
def address():  # type: ignore[no-untyped-def]
    """Set Streamlit's listen address for the app (as `onepool dashboard --address` does)."""
    before = st_config.get_option("server.address")

    def set_(a: str) -> None:
        st_config.set_option("server.address", a)

    yield set_
    st_config.set_option("server.address", before)


def _run(monkeypatch: pytest.MonkeyPatch, *, url: str | None = None, home: Path | None = None,
         token: str | None = None, params: dict[str, str] | None = None) -> AppTest:
    for k in ("ONEPOOL_URL", "ONEPOOL_HOME", "ONEPOOL_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in (("ONEPOOL_URL", url), ("ONEPOOL_HOME", str(home) if home else None),
                 ("ONEPOOL_TOKEN", token)):
        if v is not None:
            monkeypatch.setenv(k, v)
    at = AppTest.from_file(str(APP), default_timeout=60)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    return at


def _tab(at: AppTest, name: str):  # type: ignore[no-untyped-def]
    return at.tabs[TABS.index(name)]


def _metrics(at: AppTest, tab: str) -> dict[str, str]:
    return {x.label: x.value for x in _tab(at, tab).metric}


def _seen(at: AppTest) -> dict[str, object]:
    """What the page shows of each team: job ids offered, experiments, budgets' teams,
    interrupted jobs' teams, the node table's job ids, the overview's numbers."""
    jobs = at.selectbox(key="job")
    exps = _tab(at, "Cost per experiment").table[0].value
    pre = _tab(at, "Preemptions").dataframe
    nodes = _tab(at, "Nodes & pools").dataframe[1].value
    m = _metrics(at, "Overview")
    return {"jobs": {int(o.split(":")[0]) for o in jobs.options},
            "experiments": set(exps["experiment"]),
            "budgets": set(_tab(at, "Budgets").dataframe[0].value["team"]),
            "interrupted teams": set(pre[0].value["team"]) if pre else set(),
            "node jobs": {x for x in nodes["jobs"] if x},
            "now": (m["GPUs in use now"], m["jobs running now"], m["jobs waiting now"], m["GPUs free now"])}


def test_a_member_sees_its_team_only_and_an_admin_everything(lab: Lab, monkeypatch: pytest.MonkeyPatch,
                                                             address) -> None:  # type: ignore[no-untyped-def]
    address("0.0.0.0")  # as a manager's dashboard would listen
    running = next(j for j in lab.c.list() if j.status == "RUNNING")  # research's sweep-2
    seen = {who: _seen(_run(monkeypatch, url=lab.api.url, token=tok)) for who, tok in lab.tokens.items()}
    assert seen["admin"]["jobs"] == lab.ids()
    assert seen["research"]["jobs"] == lab.ids("research") and seen["prod"]["jobs"] == lab.ids("prod")
    assert seen["admin"]["experiments"] >= {"lr-sweep", "release", "idle on-prem"}
    assert seen["research"]["experiments"] == {"lr-sweep"} and seen["prod"]["experiments"] == {"release"}
    assert seen["admin"]["budgets"] == {"research", "prod"}
    assert seen["research"]["budgets"] == {"research"} and seen["prod"]["budgets"] == {"prod"}
    assert seen["admin"]["interrupted teams"] == seen["research"]["interrupted teams"] == {"research"}
    assert seen["prod"]["interrupted teams"] == set()
    assert seen["admin"]["node jobs"] == seen["research"]["node jobs"] == {str(running.id)}
    assert seen["prod"]["node jobs"] == set()  # research's job holds a GPU there: prod sees it used, no id
    # Free GPUs are the cluster's for everyone; what runs and waits, each team's own.
    assert seen["admin"]["now"] == ("1", "1", "1", "5")
    assert seen["research"]["now"] == ("1", "1", "0", "5") and seen["prod"]["now"] == ("0", "0", "1", "5")


def test_a_member_does_not_learn_which_job_preempted_it(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {who: _tab(_run(monkeypatch, url=lab.api.url, token=lab.tokens[who]), "Preemptions")
            .dataframe[0].value for who in ("admin", "research")}
    admin = rows["admin"][rows["admin"]["cause"] == "preempted"].iloc[0]
    member = rows["research"][rows["research"]["cause"] == "preempted"].iloc[0]
    assert admin["caused_by_job"] == "?tab=Jobs&job=3" and admin["caused_by_team"] == "prod"
    assert pd.isna(member["caused_by_job"]) and member["caused_by_team"] == "prod"


def test_no_token_gets_the_login_page_and_a_pasted_token_logs_in(lab: Lab,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    at = _run(monkeypatch, url=lab.api.url)
    assert not at.tabs and [h.value for h in at.subheader] == ["log in"]
    at.text_input(key="login_token").input("op_nope_wrong")
    at.button[0].click().run()
    assert not at.tabs and any("refused" in e.value for e in at.error)
    at.text_input(key="login_token").input(lab.tokens["prod"])
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs] == TABS
    assert {int(o.split(":")[0]) for o in at.selectbox(key="job").options} == lab.ids("prod")
    assert at.session_state["onepool_token"] == lab.tokens["prod"]  # in the session, nowhere else
    assert lab.tokens["prod"] not in str(dict(at.query_params))


@pytest.mark.parametrize(("who", "params", "tab", "job"), [
    ("admin", {"tab": "Jobs", "job": "sweep-0"}, "Jobs", "sweep-0"),
    ("prod", {"tab": "Jobs", "job": "hotfix"}, "Jobs", "hotfix"),
    ("admin", {"tab": "Budgets"}, "Budgets", None),
])
def test_a_link_opens_a_tab_and_a_job(lab: Lab, monkeypatch: pytest.MonkeyPatch, who: str,
                                      params: dict[str, str], tab: str, job: str | None) -> None:
    by_name = {j.name: j.id for j in lab.c.list()}
    params = {k: str(by_name.get(v, v)) for k, v in params.items()}
    at = _run(monkeypatch, url=lab.api.url, token=lab.tokens[who], params=params)
    assert at.session_state["tab"] == tab
    if job is not None:
        assert at.selectbox(key="job").value == by_name[job]
        assert _metrics(at, "Jobs")["status"] == "SUCCEEDED"


def test_a_link_to_another_teams_job_shows_nothing_of_it(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = next(j.id for j in lab.c.list() if j.name == "sweep-0")
    at = _run(monkeypatch, url=lab.api.url, token=lab.tokens["prod"],
              params={"tab": "Jobs", "job": str(sweep)})
    assert any(f"no job with id {sweep}" in w.value for w in _tab(at, "Jobs").warning)
    assert sweep not in {int(o.split(":")[0]) for o in at.selectbox(key="job").options}


def test_a_waiting_job_shows_its_reason_and_earliest_start(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _run(monkeypatch, url=lab.api.url, token=lab.tokens["prod"])
    df = _tab(at, "Jobs").dataframe[0].value
    eval_ = next(j for j in lab.c.list() if j.name == "eval")
    row = df.iloc[0]
    assert (row["job"], row["name"]) == (f"?tab=Jobs&job={eval_.id}", "eval") and len(df) == 1
    assert row["waiting because"] == "head of the queue: holding 1 GPUs in a100"
    assert row["earliest start"].count(":") == 2  # a local date and time from the estimate


@pytest.mark.parametrize(("path", "who", "status"), [
    ("/v1/dashboard", None, 401),
    ("/v1/dashboard/jobs/{sweep}", "prod", 404),  # another team's job: as if it did not exist
    ("/v1/dashboard/jobs/{sweep}/tail?attempt=1", "prod", 404),
    ("/v1/dashboard/jobs/{sweep}", "research", 200),
    ("/v1/dashboard/jobs/{sweep}/tail?attempt=9", "research", 404),
    ("/v1/dashboard/experiments/lr-sweep/jobs", "prod", 200),
    ("/v1/dashboard?hours=0", "admin", 422),
])
def test_dashboard_routes_answer_as_the_token(lab: Lab, path: str, who: str | None, status: int) -> None:
    sweep = next(j.id for j in lab.c.list() if j.name == "sweep-0")
    headers = {"Authorization": f"Bearer {lab.tokens[who]}"} if who else {}
    r = httpx.get(lab.api.url + path.format(sweep=sweep), headers=headers)
    assert r.status_code == status, r.text
    if path.endswith("lr-sweep/jobs"):
        assert r.json() == []  # prod has no job in research's experiment


def test_the_embedded_dashboard_off_loopback_asks_for_a_token(lab: Lab, monkeypatch: pytest.MonkeyPatch,
                                                               address) -> None:  # type: ignore[no-untyped-def]
    address("0.0.0.0")
    at = _run(monkeypatch, home=lab.c.store.home)
    assert not at.tabs and [h.value for h in at.subheader] == ["log in"]
    at = _run(monkeypatch, home=lab.c.store.home, token=lab.tokens["prod"])
    assert {int(o.split(":")[0]) for o in at.selectbox(key="job").options} == lab.ids("prod")
    address("127.0.0.1")  # its single local user, on its own machine: everything
    at = _run(monkeypatch, home=lab.c.store.home)
    assert {int(o.split(":")[0]) for o in at.selectbox(key="job").options} == lab.ids()


def test_the_dashboard_over_the_api_imports_nothing_of_the_server() -> None:
    """What the app imports over the API (dashboard.app's remote path) works with the server's
    parts missing, as on a laptop with `pip install 'onepool[dashboard]'` (Streamlit brings
    numpy and pandas)."""
    import os
    import subprocess
    import sys

    from tests.test_thin_client import ROOT, SERVER

    blocked = tuple(m for m in SERVER if m != "numpy")
    code = f"""import sys
for m in {blocked!r}:
    sys.modules[m] = None  # as if not installed
import broker.errors, broker.client.http, broker.client.cli_estimate
import dashboard.remote, dashboard.sections, dashboard.tabs, dashboard.wire
server = ("broker.state", "broker.control", "broker.api", "dashboard.data", "dashboard.queries")
print("server modules:", sorted(m for m in sys.modules if m.startswith(server)))
"""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "server modules: []"


def test_a_members_log_tail_comes_over_the_api(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's machine has no run folders: the tail of the running attempt's output
    comes from the server (GET /v1/dashboard/jobs/ID/tail)."""
    running = next(j for j in lab.c.list() if j.status == "RUNNING")
    run = lab.c.store.home / "runs" / f"attempt-{running.attempt_list[-1].id}" / "rank-0"
    run.mkdir(parents=True)
    (run / "output.log").write_text("step 39 loss 0.41\nstep 40 loss 0.40\n")
    at = _run(monkeypatch, url=lab.api.url, token=lab.tokens["research"])
    assert at.selectbox(key="job").value == running.id
    assert _tab(at, "Jobs").code[0].value.strip() == "step 39 loss 0.41\nstep 40 loss 0.40"


def test_a_server_that_does_not_answer_is_named_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    at = _run(monkeypatch, url=url, token="op_x_y")
    assert not at.tabs and any(f"the onepool server at {url} did not answer" in e.value for e in at.error)

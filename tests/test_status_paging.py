"""Issue 27, part 3: `onepool status` shows one page (the running jobs first, then the newest)
under a line of counts per state, from the SDK, the fast SQLite reader and the API alike; and
the CLI over HTTP imports no database layer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from broker.client.reader import open_reader
from broker.state.model import Job
from tests.dashboard.seed import seed

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return seed(tmp_path_factory.mktemp("paging") / "home")


def expected(c: Any, limit: int, states: set[str] | None = None) -> list[int]:
    """The page by its definition: running first, then by id, newest first."""
    with c.store.session() as s:
        rows = [(j.id, j.state) for j in s.exec(select(Job)).all() if states is None or j.state in states]
    return [i for i, _ in sorted(rows, key=lambda r: (r[1] != "RUNNING", -r[0]))][:limit]


# (list arguments, states the page keeps)
PAGES: list[tuple[dict[str, Any], set[str] | None]] = [
    ({"limit": 1}, None),
    ({"limit": 3}, None),
    ({"limit": 1000}, None),
    ({"limit": 2, "status": ["pending", "succeeded"]}, {"PENDING", "SUCCEEDED"}),
    ({"limit": 5, "status": ["running"]}, {"RUNNING"}),
]


@pytest.mark.parametrize(("args", "states"), PAGES, ids=[str(a) for a, _ in PAGES])
def test_a_page_is_the_running_first_then_the_newest(home: Any, args: dict[str, Any],
                                                     states: set[str] | None) -> None:
    want = expected(home, args["limit"], states)
    assert [j.id for j in home.list(newest=True, **args)] == want
    r = open_reader(home.store.home, home.clock)
    assert r is not None
    assert [j.id for j in r.list(newest=True, **args)] == want


@pytest.mark.parametrize("team", [None, "prod", "research"])
def test_counts_are_one_group_by_and_the_reader_agrees(home: Any, team: str | None) -> None:
    with home.store.session() as s:
        states = [j.state for j in s.exec(select(Job)).all() if team is None or j.team == team]
    want = {st: states.count(st) for st in set(states)}
    assert home.counts(team) == want
    r = open_reader(home.store.home, home.clock)
    assert r is not None and r.counts(team) == want


def test_the_api_pages_and_counts(home: Any) -> None:
    from fastapi.testclient import TestClient

    from broker.api.app import create_app

    token = home.create_token("prod", "admin").token
    with TestClient(create_app(home.store, home.clock)) as http:
        auth = {"Authorization": f"Bearer {token}"}
        page = http.get("/v1/jobs", params={"newest": "true", "limit": 2}, headers=auth).json()
        assert [j["id"] for j in page["jobs"]] == expected(home, 2)
        assert page["next_after_id"] is None
        assert http.get("/v1/jobs/counts", headers=auth).json() == home.counts()
        member = {"Authorization": f"Bearer {home.create_token('research').token}"}
        assert http.get("/v1/jobs/counts", headers=member).json() == home.counts("research")
        mine = http.get("/v1/jobs", params={"newest": "true", "limit": 1000}, headers=member).json()
        assert {j["team"] for j in mine["jobs"]} == {"research"}  # a member pages its team's only
        refused = http.get("/v1/jobs/counts", params={"team": "prod"}, headers=member)
        assert refused.status_code == 403, refused.text


def test_the_cli_over_http_imports_no_database_layer() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    env.update(PYTHONPATH=str(ROOT), ONEPOOL_URL="http://127.0.0.1:9")
    code = ("import sys, broker.client.cli, broker.client.http\n"
            "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'alembic', 'broker.state.model') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# (status arguments, how many job rows, whether the counts line says it is one page)
CLI_PAGES: list[tuple[list[str], int, bool]] = [
    (["--limit", "2"], 2, True),
    (["--limit", "1", "--state", "pending"], 1, True),
    (["--all"], 3, False),
    ([], 3, True),
]


@pytest.mark.parametrize(("args", "rows", "paged"), CLI_PAGES,
                         ids=[" ".join(a) or "default" for a, _, _ in CLI_PAGES])
def test_the_cli_shows_a_page_under_a_line_of_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     args: list[str], rows: int, paged: bool) -> None:
    from typer.testing import CliRunner

    from broker.client.cli import app
    from broker.client.sdk import Client
    from broker.spec import parse_config
    from tests.conftest import config

    monkeypatch.delenv("ONEPOOL_URL", raising=False)
    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))
    ids = [c.submit(name=f"job-{i}", team="prod", command=["true"]).id for i in range(3)]
    c.cancel(ids[0])
    res = CliRunner().invoke(app, ["--home", str(tmp_path / "home"), "status", *args])
    assert res.exit_code == 0, res.output
    [counts] = [ln for ln in res.stdout.splitlines() if ln.startswith("3 jobs:")]
    assert counts.startswith("3 jobs: 1 cancelled, 2 pending")
    assert ("showing" in counts) is paged
    shown = [i for n, i in enumerate(ids) if f"job-{n}" in res.stdout]
    assert len(shown) == rows
    if paged and rows < 3:
        assert shown[-1] == ids[-1]  # the newest first

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


def test_the_cli_over_http_imports_no_database_layer() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    env.update(PYTHONPATH=str(ROOT), ONEPOOL_URL="http://127.0.0.1:9")
    code = ("import sys, broker.client.cli, broker.client.http\n"
            "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'alembic', 'broker.state.model') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"

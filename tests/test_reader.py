"""The fast read path of `onepool status` (broker.client.reader) answers exactly as the SDK does,
or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from broker.client.reader import open_reader
from broker.errors import NotFound, SpecError
from tests.dashboard.seed import seed

FILTERS: list[dict[str, Any]] = [
    {}, {"status": ["running"]}, {"status": ["SUCCEEDED", "pending"]}, {"team": "prod"},
    {"experiment": "lr-sweep"}, {"finished_limit": 1}, {"finished_limit": 0, "team": "research"},
    {"status": ["succeeded"], "finished_limit": 2}, {"experiment": "nothing-here"},
]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The dashboard's seeded home, plus checkpoints of job 1 in two stores (one deleted since,
    one upload never committed)."""
    from broker.state.model import Checkpoint

    c = seed(tmp_path_factory.mktemp("reader") / "home")
    t = c.clock.now()
    with c.store.session() as s:
        for step, store, state in [(4, "s3://b/ck", "deleted"), (8, "file:///x/ck", "committed"),
                                   (9, "gs://g/ck", "partial")]:
            s.add(Checkpoint(job_id=1, step=step, uri=f"{store}/{step}", observed_at=t + step, bytes=10,
                             store=store, state=state))
    return c


@pytest.mark.parametrize("filters", FILTERS, ids=[str(f) for f in FILTERS])
def test_list_equals_the_sdk(home: Any, filters: dict[str, Any]) -> None:
    r = open_reader(home.store.home, home.clock)
    assert r is not None
    assert r.list(**filters) == home.list(**filters)


def test_get_equals_the_sdk_for_every_job(home: Any) -> None:
    r = open_reader(home.store.home, home.clock)
    assert r is not None
    jobs = home.list()
    assert len(jobs) == 5 and home.get(1).checkpoint_stores == ["s3://b/ck", "file:///x/ck"]
    assert home.get(3).caused_lost_gpu_s == 600.0  # its preemption of job 1
    for j in jobs:
        assert r.get(j.id) == home.get(j.id)
    with pytest.raises(NotFound, match="no job with id 99"):
        r.get(99)


@pytest.mark.parametrize(("filters", "says"), [
    ({"status": ["bogus"]}, "status: must be one of pending, running"),
    ({"team": "nlp"}, "team: must be one of research, prod"),
])
def test_bad_filters_are_the_same_errors(home: Any, filters: dict[str, Any], says: str) -> None:
    r = open_reader(home.store.home, home.clock)
    assert r is not None
    for client in (r, home):
        with pytest.raises(SpecError, match=says):
            client.list(**filters)


def test_no_answer_where_only_the_sdk_can_answer(tmp_path: Path, home: Any, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert open_reader(tmp_path / "nothing-here") is None  # no database yet
    monkeypatch.setenv("ONEPOOL_DATABASE_URL", "postgresql://localhost/onepool")
    assert open_reader(home.store.home) is None
    monkeypatch.delenv("ONEPOOL_DATABASE_URL")
    with home.store.engine.begin() as conn:  # a schema behind the code's: let the SDK migrate
        conn.execute(text("UPDATE alembic_version SET version_num = '0004'"))
    try:
        assert open_reader(home.store.home) is None
    finally:
        with home.store.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0005'"))

"""The schema comes from Alembic migrations, matches the models, and survives reopening."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from broker.sdk import Client
from broker.spec import parse_config
from broker.store import Store
from tests.conftest import config


def test_migrations_at_head_match_the_models(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        assert ctx.get_current_revision() is not None
        assert compare_metadata(ctx, SQLModel.metadata) == []


def test_state_survives_reopening(tmp_path: Path) -> None:
    c = Client(tmp_path)
    c.apply(parse_config(config()))
    j = c.submit(name="keep", team="research", command=["true"]).id
    c.store.dispose()
    again = Client(tmp_path)
    assert again.get(j).name == "keep" and again.get(j).status == "PENDING"


def test_database_url_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("ONEPOOL_DATABASE_URL", url)
    store = Store(tmp_path / "home")
    assert store.url == url and (tmp_path / "elsewhere.db").exists()
    assert not (tmp_path / "home" / "onepool.db").exists()

"""The schema comes from Alembic migrations, matches the models, and survives reopening."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from broker.client.sdk import Client
from broker.spec import parse_config
from broker.state.store import Store
from tests.conftest import config

pytestmark = [pytest.mark.both_dbs, pytest.mark.real_migrations]


def test_migrations_at_head_match_the_models(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        assert ctx.get_current_revision() is not None
        assert compare_metadata(ctx, SQLModel.metadata) == []


def test_every_migration_applies_to_an_empty_database_and_the_newest_reverts(
        tmp_path: Path, db: str, request: pytest.FixtureRequest) -> None:
    """From nothing to head, back to 0004 and up again, on SQLite and on PostgreSQL."""
    from alembic import command
    from sqlalchemy import inspect, text

    from broker.state.store import alembic_config, make_engine

    url = (request.getfixturevalue("pg_server").fresh_database(migrated=False) if db == "postgresql"
           else f"sqlite:///{tmp_path / 'empty.db'}")
    eng = make_engine(url)
    try:
        command.upgrade(alembic_config(eng), "head")
        with eng.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, SQLModel.metadata) == []
            assert conn.execute(text("SELECT name, fencing FROM lease")).all() == [("broker", 0)]
        command.downgrade(alembic_config(eng), "0004")
        assert not {"lease", "notice"} & set(inspect(eng).get_table_names())
        command.upgrade(alembic_config(eng), "head")
        assert {"lease", "notice"} <= set(inspect(eng).get_table_names())
    finally:
        eng.dispose()
        if db == "postgresql":
            request.getfixturevalue("pg_server").drop_database(url)


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


def test_upgrade_from_0001_keeps_checkpoint_rows_and_fills_their_store(tmp_path: Path) -> None:
    from alembic import command
    from sqlalchemy import text

    from broker.state.store import alembic_config, make_engine

    eng = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    command.upgrade(alembic_config(eng), "0001")
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO team (name, weight, priority_allowance_gpus) VALUES ('t', 1, 8)"))
        conn.execute(text(
            "INSERT INTO job (id, name, experiment, team, command, env, gpus_per_node, nodes, gpu_types,"
            " priority, spot, checkpoint_interval_s, state, submit_time, queued_at, wait_s,"
            " cancel_requested, attempts, preemptions, checkpoint_uri) VALUES (1, 'j', 'e', 't', '[]',"
            " '{}', 1, 1, '[]', 'low', 'allowed', 60, 'PENDING', 0, 0, 0, 0, 0, 0, 's3://b/x/t/e/1')"))
        conn.execute(text("INSERT INTO checkpoint (job_id, step, uri, observed_at, bytes) VALUES "
                          "(1, 4, 's3://b/x/t/e/1/step-000000000004', 5, 10)"))
    command.upgrade(alembic_config(eng), "head")
    with eng.connect() as conn:
        row = conn.execute(text("SELECT store, state, step FROM checkpoint")).one()
    assert tuple(row) == ("s3://b/x", "committed", 4)


def test_two_cloud_workers_making_the_broker_secret_at_once_share_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker secret is made on first use by whichever cloud worker (one thread per rented
    pool) launches first. When another worker stores it between this one's look and its
    insert, this launch goes on with the stored secret: same join token, no IntegrityError
    failing the pool's round (found by `make chaos`)."""
    from broker.state import tokens
    from broker.state.model import Setting

    store = Store(tmp_path)
    made = iter(["11" * 32, "22" * 32])
    real = tokens.secrets.token_hex

    def other_worker_wins(n: int) -> str:  # runs inside this worker's window, after its look
        mine = next(made)
        if mine == "11" * 32:
            with store.session() as other:
                assert tokens._broker_secret(other) == bytes.fromhex("22" * 32)
        return mine

    monkeypatch.setattr(tokens.secrets, "token_hex", other_worker_wins)
    with store.session() as s:
        token = tokens.derived_join_token(s, "spot-0", "launch-token", 0.0, 60.0)
    monkeypatch.setattr(tokens.secrets, "token_hex", real)
    with store.session() as s:
        row = s.get(Setting, "broker_secret")
        assert row is not None and row.value == {"hex": "22" * 32}
        assert tokens.derived_join_token(s, "spot-0", "launch-token", 0.0, 60.0) == token

"""Alembic environment: runs against the engine handed in by broker.state.store (or the URL)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import broker.state.model
import broker.state.model_access  # noqa: F401

config = context.config
target_metadata = SQLModel.metadata


def run() -> None:
    engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata,
                          render_as_batch=conn.dialect.name == "sqlite", compare_type=True)
        with context.begin_transaction():
            context.run_migrations()


run()

"""observability (issue 30): GPU utilization from the agents (per rank its newest sample, per
attempt its newest mean over its ranks, its time-weighted mean and since when it has been below
the idle threshold); a job's own webhook and the webhook deliveries' outbox
(broker.control.notify); an index covering the metrics' spend by team, pool and kind

Revision ID: 0018
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0018'
down_revision = '0016'
branch_labels = None
depends_on = None

ATTEMPT = [("gpu_util_pct", True), ("gpu_util_mean_pct", True), ("gpu_util_s", False),
           ("gpu_util_at", True), ("gpu_idle_since", True)]


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        for name, nullable in ATTEMPT:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=nullable,
                                          server_default=None if nullable else "0"))
    with op.batch_alter_table("rankassignment", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_util_pct", sa.Float(), nullable=True))
    with op.batch_alter_table("ledgerentry", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_spend", ["team", "pool", "kind", "usd"], unique=False)
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook_url", sqlmodel.sql.sqltypes.AutoString(length=2000),
                                      nullable=True))
        batch_op.add_column(sa.Column("webhook_secret", sqlmodel.sql.sqltypes.AutoString(length=200),
                                      nullable=True))
    op.create_table(
        "webhookdelivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=False),
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(length=63), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id"))
    with op.batch_alter_table("webhookdelivery", schema=None) as batch_op:
        batch_op.create_index("ix_webhookdelivery_target_event", ["target", "event_id"], unique=True)
        batch_op.create_index(batch_op.f("ix_webhookdelivery_next_at"), ["next_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_webhookdelivery_delivered_at"), ["delivered_at"], unique=False)


def downgrade() -> None:
    op.drop_table("webhookdelivery")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("webhook_secret")
        batch_op.drop_column("webhook_url")
    with op.batch_alter_table("ledgerentry", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_spend")
    with op.batch_alter_table("rankassignment", schema=None) as batch_op:
        batch_op.drop_column("gpu_util_pct")
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        for name, _ in reversed(ATTEMPT):
            batch_op.drop_column(name)

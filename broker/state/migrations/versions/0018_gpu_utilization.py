"""GPU utilization from the agents (issue 30): per rank its newest sample, per attempt its newest
mean over its ranks, its time-weighted mean and since when it has been below the idle threshold

Revision ID: 0018
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0011'
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


def downgrade() -> None:
    with op.batch_alter_table("rankassignment", schema=None) as batch_op:
        batch_op.drop_column("gpu_util_pct")
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        for name, _ in reversed(ATTEMPT):
            batch_op.drop_column(name)

"""byte counts as 64-bit integers (a checkpoint passes 2 GiB; PostgreSQL's INTEGER is 32-bit)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

COLUMNS = [("checkpoint", "bytes"), ("attempt", "restore_bytes"), ("attempt", "egress_bytes")]


def upgrade() -> None:
    for table, column in COLUMNS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column(column, existing_type=sa.Integer(), type_=sa.BigInteger(),
                                  existing_nullable=False)


def downgrade() -> None:
    for table, column in COLUMNS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column(column, existing_type=sa.BigInteger(), type_=sa.Integer(),
                                  existing_nullable=False)

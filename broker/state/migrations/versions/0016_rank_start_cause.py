"""a rank assignment's cause: why an agent could not start the rank (start_failed:<kind>)

Revision ID: 0016
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0016'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('rankassignment', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cause', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('rankassignment', schema=None) as batch_op:
        batch_op.drop_column('cause')

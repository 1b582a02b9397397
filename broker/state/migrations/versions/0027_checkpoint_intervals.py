"""checkpoint intervals from measured costs (issue 31): each checkpoint's measured save time,
whether a job's interval is advised by the broker (`checkpoint_interval_s: auto`), and the
advice at its last start; a job's deadline and where the deadline rule last said it may run

Revision ID: 0027
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0027'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('checkpoint', schema=None) as batch_op:
        batch_op.add_column(sa.Column('save_s', sa.Float(), nullable=True))
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('checkpoint_auto', sa.Boolean(), nullable=False,
                                      server_default='0'))
        batch_op.add_column(sa.Column('checkpoint_advice', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('deadline', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('deadline_where', sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('deadline_where')
        batch_op.drop_column('deadline')
        batch_op.drop_column('checkpoint_advice')
        batch_op.drop_column('checkpoint_auto')
    with op.batch_alter_table('checkpoint', schema=None) as batch_op:
        batch_op.drop_column('save_s')

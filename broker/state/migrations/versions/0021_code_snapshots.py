"""workloads that travel (issue 26): a job's code digest, where nodes fetch it, its setup
commands and data; an attempt's restart phases

Revision ID: 0021
Revises: 0027
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('code_sha256', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('code_uri', sa.String(length=4200), nullable=True))
        batch_op.add_column(sa.Column('setup', sa.JSON(), nullable=False, server_default='[]'))
        batch_op.add_column(sa.Column('data', sa.JSON(), nullable=False, server_default='{}'))


    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.add_column(sa.Column('phases', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.drop_column('phases')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('data')
        batch_op.drop_column('setup')
        batch_op.drop_column('code_uri')
        batch_op.drop_column('code_sha256')

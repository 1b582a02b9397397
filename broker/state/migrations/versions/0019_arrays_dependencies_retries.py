"""arrays, dependencies and retries (issue 29): a job's place in its array, the jobs it waits
for, and its retries of its own failures

Revision ID: 0019
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('array_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('array_index', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('array_limit', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('after', sa.JSON(), nullable=False, server_default='[]'))
        batch_op.add_column(sa.Column('retries', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('retried', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('retry_backoff_s', sa.Float(), nullable=False, server_default='30'))
        batch_op.add_column(sa.Column('no_retry_exit_codes', sa.JSON(), nullable=False,
                                      server_default='[]'))
        batch_op.add_column(sa.Column('not_before', sa.Float(), nullable=True))
        batch_op.create_index(batch_op.f('ix_job_array_id'), ['array_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_array_id'))
        for c in ('not_before', 'no_retry_exit_codes', 'retry_backoff_s', 'retried', 'retries',
                  'after', 'array_limit', 'array_index', 'array_id'):
            batch_op.drop_column(c)

"""people inside teams (issue 28): a token may belong to a person of its team; a job records
that person and whether it is on hold

Revision ID: 0025
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0025'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('apitoken', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user', sa.String(length=63), nullable=True))
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user', sa.String(length=63), nullable=True))
        batch_op.add_column(sa.Column('held_by', sa.String(length=120), nullable=True))
        batch_op.create_index(batch_op.f('ix_job_user'), ['user'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_user'))
        batch_op.drop_column('held_by')
        batch_op.drop_column('user')
    with op.batch_alter_table('apitoken', schema=None) as batch_op:
        batch_op.drop_column('user')

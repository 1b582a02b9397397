"""honest money (issue 13): node phases on the meter, checkpoint storage rows, job progress

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodemeter', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rented', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('ready_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('drain_at', sa.Float(), nullable=True))
    with op.batch_alter_table('ledgerentry', schema=None) as batch_op:
        batch_op.add_column(sa.Column('checkpoint_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('gb', sa.Float(), nullable=False, server_default='0'))
        batch_op.create_index(batch_op.f('ix_ledgerentry_checkpoint_id'), ['checkpoint_id'], unique=False)
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.add_column(sa.Column('progress_step', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('progress_total', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('progress_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('progress_rate', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('progress_read_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        for c in ('progress_read_at', 'progress_rate', 'progress_at', 'progress_total', 'progress_step'):
            batch_op.drop_column(c)
    with op.batch_alter_table('ledgerentry', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ledgerentry_checkpoint_id'))
        batch_op.drop_column('gb')
        batch_op.drop_column('checkpoint_id')
    with op.batch_alter_table('nodemeter', schema=None) as batch_op:
        batch_op.drop_column('drain_at')
        batch_op.drop_column('ready_at')
        batch_op.drop_column('rented')

"""one leader (lease with a fencing number) and recorded interruption notices (issue 10)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    lease = op.create_table(
        'lease',
        sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column('holder', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column('fencing', sa.Integer(), nullable=False),
        sa.Column('acquired_at', sa.Float(), nullable=True),
        sa.Column('renewed_at', sa.Float(), nullable=True),
        sa.Column('expires_at', sa.Float(), nullable=False),
        sa.Column('cycled_at', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint('name'),
    )
    op.bulk_insert(lease, [{'name': 'broker', 'holder': None, 'fencing': 0, 'expires_at': 0.0}])
    op.create_table(
        'notice',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column('pool', sqlmodel.sql.sqltypes.AutoString(length=63), nullable=False),
        sa.Column('instance_id', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column('deadline', sa.Float(), nullable=True),
        sa.Column('received_at', sa.Float(), nullable=False),
        sa.Column('handled_at', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('notice', schema=None) as batch_op:
        batch_op.create_index('ix_notice_key', ['key'], unique=True)
        batch_op.create_index(batch_op.f('ix_notice_handled_at'), ['handled_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('notice', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_notice_handled_at'))
        batch_op.drop_index('ix_notice_key')
    op.drop_table('notice')
    op.drop_table('lease')

"""provider notices (what a provider read from its cloud's API, once per pool); node
instance ids long enough for Azure resource paths (issue 15)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('providernotice',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pool', sqlmodel.sql.sqltypes.AutoString(length=63), nullable=False),
    sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('instance_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('scope', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('seen_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('providernotice', schema=None) as batch_op:
        batch_op.create_index('ix_providernotice_pool_key', ['pool', 'key'], unique=True)

    with op.batch_alter_table('node', schema=None) as batch_op:
        batch_op.alter_column('instance_id', existing_type=sqlmodel.sql.sqltypes.AutoString(length=128),
                              type_=sqlmodel.sql.sqltypes.AutoString(length=300), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table('node', schema=None) as batch_op:
        batch_op.alter_column('instance_id', existing_type=sqlmodel.sql.sqltypes.AutoString(length=300),
                              type_=sqlmodel.sql.sqltypes.AutoString(length=128), existing_nullable=True)

    with op.batch_alter_table('providernotice', schema=None) as batch_op:
        batch_op.drop_index('ix_providernotice_pool_key')

    op.drop_table('providernotice')

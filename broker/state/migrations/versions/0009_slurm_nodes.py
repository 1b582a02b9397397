"""slurm nodes: GPUs other Slurm users hold

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('node', schema=None) as batch_op:
        batch_op.add_column(sa.Column('held_elsewhere', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('node', schema=None) as batch_op:
        batch_op.drop_column('held_elsewhere')

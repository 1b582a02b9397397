"""a change counter on job and attempt rows (issue 27): the leader reads only what changed;
an index on job.cancel_requested (the cycle's cancel lookup no longer scans the queue)

Every insert and update of a job or attempt row takes the next number of the one-row
`changecounter` table into the row's `change_seq`, by a trigger, so every writer (the ORM, a
core UPDATE, another process) is counted. On PostgreSQL the trigger's UPDATE of the counter
row holds its lock until the writer's commit, so the numbers become visible in the order they
were given: a reader that saw the counter at N has seen every row numbered <= N
(broker.control.kept). SQLite has one writer at a time: the same holds.

One write is not counted: an UPDATE that sets change_seq to another number <= 0 (0, or -1 on
a row at 0). The leader writes its "why waiting" reasons so (only on rows unchanged since it read them): it
knows what it wrote, and reading 100,000 reasons back would cost more than the cycle.

Revision ID: 0023
Revises: 0021
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0021'
branch_labels = None
depends_on = None

TABLES = ("job", "attempt")
PG_FUNCTION = """
CREATE OR REPLACE FUNCTION onepool_change_seq() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.change_seq <= 0 AND NEW.change_seq <> OLD.change_seq THEN
        RETURN NEW;  -- the leader's own "why waiting": not counted (see the module docstring)
    END IF;
    UPDATE changecounter SET n = n + 1 WHERE name = 'rows' RETURNING n INTO NEW.change_seq;
    RETURN NEW;
END
$$ LANGUAGE plpgsql
"""


def _sqlite_triggers(table: str) -> list[str]:
    bump = ("UPDATE changecounter SET n = n + 1 WHERE name = 'rows'; "
            f"UPDATE {table} SET change_seq = (SELECT n FROM changecounter WHERE name = 'rows') "
            "WHERE id = NEW.id;")
    return [f"CREATE TRIGGER {table}_change_seq_insert AFTER INSERT ON {table} BEGIN {bump} END",
            # the trigger's own UPDATE changes change_seq: it does not fire this one again; nor
            # does the leader's reasons write, which sets it to 0 or -1 (not counted)
            f"CREATE TRIGGER {table}_change_seq_update AFTER UPDATE ON {table} "
            f"WHEN NEW.change_seq IS OLD.change_seq BEGIN {bump} END"]


def upgrade() -> None:
    op.create_table('changecounter',
                    sa.Column('name', sa.String(length=32), nullable=False),
                    sa.Column('n', sa.BigInteger(), nullable=False),
                    sa.PrimaryKeyConstraint('name'))
    op.execute("INSERT INTO changecounter (name, n) VALUES ('rows', 0)")
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('change_seq', sa.BigInteger(), nullable=False,
                                          server_default='0'))
            batch_op.create_index(batch_op.f(f'ix_{table}_change_seq'), ['change_seq'], unique=False)
    with op.batch_alter_table('job', schema=None) as batch_op:  # the cycle's cancel lookup
        batch_op.create_index(batch_op.f('ix_job_cancel_requested'), ['cancel_requested'], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for table in TABLES:
            op.execute(f"CREATE TRIGGER {table}_change_seq BEFORE INSERT OR UPDATE ON {table} "
                       "FOR EACH ROW EXECUTE FUNCTION onepool_change_seq()")
    else:
        for table in TABLES:
            for stmt in _sqlite_triggers(table):
                op.execute(stmt)


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_cancel_requested'))
    for table in TABLES:
        if pg:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_change_seq ON {table}")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_change_seq_insert")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_change_seq_update")
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(batch_op.f(f'ix_{table}_change_seq'))
            batch_op.drop_column('change_seq')
    if pg:
        op.execute("DROP FUNCTION IF EXISTS onepool_change_seq()")
    op.drop_table('changecounter')

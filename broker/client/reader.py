"""A fast read-only client for `onepool status`: the SDK's `get()` and `list()` over a local
SQLite home through the stdlib's sqlite3, without importing SQLAlchemy (which alone takes
longer to import than the whole command may take).

It answers only when it can answer exactly as `broker.client.sdk.Client` does: the database
is a SQLite file whose schema is at the newest migration, so the rows hold exactly the model's
columns. Column types come from the schema itself (JSON and BOOLEAN columns are decoded by
their declared type), and the rows go through the very same `JobInfo.of` as the SDK's. Where
it cannot (PostgreSQL, an old schema, no database yet), `open_reader` returns None and the
caller uses the SDK. tests/test_reader.py checks both give equal answers.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from broker.client.filters import check_filters
from broker.clock import Clock, SystemClock
from broker.errors import NotConfigured, NotFound
from broker.state.access import check_user
from broker.state.health_view import assess
from broker.state.schema_head import head_revision
from broker.state.states import CheckpointState, EndReason, JobState
from broker.state.views import JobInfo
from broker.wire import Health

LIVED = (CheckpointState.COMMITTED, CheckpointState.DAMAGED, CheckpointState.DELETED)
FINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)  # as broker.client.sdk.FINAL
_CONVERTERS = {"JSON": json.loads, "BOOLEAN": lambda b: bool(int(b))}


def open_reader(home: str | os.PathLike[str] | None = None, clock: Clock | None = None) -> Reader | None:
    """A Reader of the home's database, or None when only the SDK can answer (see module doc)."""
    url = os.environ.get("ONEPOOL_DATABASE_URL")
    if url is not None and not url.startswith("sqlite:///"):
        return None
    base = Path(home or os.environ.get("ONEPOOL_HOME") or ".onepool").absolute()
    path = Path(url.removeprefix("sqlite:///")) if url else base / "onepool.db"
    if not path.is_file():
        return None
    for name, fn in _CONVERTERS.items():
        sqlite3.register_converter(name, fn)
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, detect_types=sqlite3.PARSE_DECLTYPES,
                           timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        at = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        at = None
    if at is None or at[0] != head_revision():
        conn.close()
        return None
    return Reader(conn, clock or SystemClock())


class Reader:
    """`get(job_id)` and `list(status=, team=, experiment=)` with the SDK's answers and errors."""

    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self.conn, self.clock = conn, clock

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[SimpleNamespace]:
        return [SimpleNamespace(**dict(r)) for r in self.conn.execute(sql, tuple(args))]

    def get(self, job_id: int) -> JobInfo:
        """The job with its attempts. Raises NotFound."""
        jobs = self._rows("SELECT * FROM job WHERE id = ?", [job_id])
        if not jobs:
            raise NotFound(f"no job with id {job_id}")
        return self._infos(jobs)[0]

    def list(self, *, status: Iterable[str] | None = None, team: str | None = None,
             experiment: str | None = None, finished_limit: int | None = None,
             limit: int | None = None, newest: bool = False, user: str | None = None) -> list[JobInfo]:
        """Jobs, oldest first (`newest`: the running first, then the newest), at most `limit`,
        filtered as the SDK's `list` does. Raises SpecError for a status or team that does not
        exist (broker.client.filters)."""
        states = check_filters(status, team, self._teams() if team is not None else None)
        where, args = [], []
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args += states
        if team:
            where.append("team = ?")
            args.append(team)
        if experiment:
            where.append("experiment = ?")
            args.append(experiment)
        if user:
            where.append('"user" = ?')
            args.append(check_user(user, "list"))
        if finished_limit is not None:
            final = [str(x) for x in FINAL]
            marks = ", ".join("?" * len(final))
            scoped = (("team", team), ("experiment", experiment), ('"user"', user))
            scope = "".join(f" AND {c} = ?" for c, v in scoped if v)
            where.append(f"(state NOT IN ({marks}) OR id IN (SELECT id FROM job WHERE state IN ({marks})"
                         f"{scope} ORDER BY id DESC LIMIT ?))")
            args += [*final, *final, *[v for v in (team, experiment, user) if v], finished_limit]
        sql = "SELECT * FROM job" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY state = ? DESC, id DESC" if newest else " ORDER BY id"
        args += [str(JobState.RUNNING)] if newest else []
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return self._infos(self._rows(sql, args))

    def counts(self, team: str | None = None) -> dict[str, int]:
        """How many jobs are in each state, as the SDK's `counts`."""
        check_filters(None, team, self._teams() if team is not None else None)
        sql = "SELECT state, count(*) FROM job" + (" WHERE team = ?" if team else "") + " GROUP BY state"
        return {str(st): int(n) for st, n in self.conn.execute(sql, [team] if team else [])}

    def _teams(self) -> list[str] | None:
        row = self.conn.execute("SELECT value FROM setting WHERE key = 'config'").fetchone()
        if row is None:
            raise NotConfigured("no onepool.yaml has been applied to this broker home yet: "
                                "run `onepool apply -c onepool.yaml` (or start `onepool broker -c ...`)")
        value = row[0] if isinstance(row[0], dict) else json.loads(row[0])
        return [t["name"] for t in value.get("teams", [])]

    def _infos(self, jobs: list[SimpleNamespace]) -> list[JobInfo]:
        ids = [j.id for j in jobs]
        marks = ", ".join("?" * len(ids))
        attempts: dict[int, list[SimpleNamespace]] = {}
        stores: dict[int, list[str]] = {}
        caused: dict[int, float] = {}
        if ids:
            for a in self._rows(f"SELECT * FROM attempt WHERE job_id IN ({marks})", ids):
                attempts.setdefault(a.job_id, []).append(a)
            lived = [str(s) for s in LIVED]
            for r in self.conn.execute(
                    f"SELECT job_id, store FROM checkpoint WHERE job_id IN ({marks}) AND state IN "
                    f"({', '.join('?' * len(lived))}) ORDER BY observed_at, id", [*ids, *lived]):
                lst = stores.setdefault(r["job_id"], [])
                if r["store"] not in lst:
                    lst.append(r["store"])
            for r in self.conn.execute(
                    f"SELECT preempted_by, lost_gpu_s FROM attempt WHERE preempted_by IN ({marks}) "
                    "AND end_reason = ?", [*ids, str(EndReason.PREEMPTED)]):
                caused[r["preempted_by"]] = caused.get(r["preempted_by"], 0.0) + r["lost_gpu_s"]
        now = self.clock.now()
        return [JobInfo.of(j, attempts.get(j.id, []), now, stores=stores.get(j.id),  # type: ignore[arg-type]
                           caused_lost_gpu_s=caused.get(j.id, 0.0)) for j in jobs]

    def health(self) -> Health:
        """As broker.control.health.health, from the lease row and the applied settings."""
        from broker.spec import BrokerSettings

        rows = self._rows("SELECT * FROM lease WHERE name = 'broker'")
        cfg = self._rows("SELECT value FROM setting WHERE key = 'config'")
        given = (cfg[0].value or {}).get("broker", {}) if cfg else {}
        defaults = BrokerSettings.model_fields
        lease_s = float(given.get("lease_s", defaults["lease_s"].default))
        cycle_s = float(given.get("cycle_s", defaults["cycle_s"].default))
        return assess(rows[0] if rows else None, lease_s, cycle_s, self.clock.now())

    def close(self) -> None:
        self.conn.close()


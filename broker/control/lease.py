"""One leader per database: a lease with a fencing number, and fenced writes.

Contract:

- The lease is one row (`Lease`, name "broker"): holder, expiry, fencing number. A broker
  takes it when it is free, expired, or held by a process of this host that no longer
  exists (a broker restarted after a crash does not wait out its own dead lease). Taking it
  adds one to the fencing number, atomically (a conditional UPDATE on the number read), so
  two standbys racing for it cannot both win, on SQLite and on PostgreSQL.
- The holder renews it every cycle, between cycles, and inside long cycles (`ensure()`, at
  least every lease_s / 3), so a standby takes over at most `lease_s` (+ its poll interval)
  after the leader's last renewal.
- Fencing: every session of `FencedStore` (the engine's view of the store) that wrote
  anything re-checks, inside the same transaction and just before COMMIT, that the row still
  holds its holder and fencing number (an UPDATE matching that number: it takes the row's
  write lock, so a takeover is ordered before or after the whole transaction). If another
  broker took the lease, the commit is refused with LeaseLost and everything rolls back: a
  paused old leader that wakes up cannot write. Its actions on the world are guarded too:
  each is preceded by a committed (fenced) intent, and `ensure()` re-validates a lease not
  renewed for lease_s / 3 before acting.
- Times are on the broker's injected clock (wall clocks in production: keep hosts in NTP;
  a skew far below lease_s is harmless).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
from sqlalchemy import event, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import ORMExecuteState
from sqlmodel import Session

from broker.clock import Clock
from broker.crashpoints import crash_point
from broker.errors import LeaseLost
from broker.state.model import Lease as LeaseRow
from broker.state.store import Store, StoreView

NAME = "broker"
T = LeaseRow.__table__  # type: ignore[attr-defined]


def new_holder() -> str:
    """A holder id naming this process: host:pid:create-time:random."""
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{me.create_time():.2f}:{uuid.uuid4().hex[:8]}"


def holder_gone(holder: str | None) -> bool:
    """True if `holder` names a process of THIS host that no longer exists (pid gone, or
    reused by a process started at another time). Holders of other hosts: False."""
    if not holder:
        return True
    parts = holder.split(":")
    if len(parts) < 4 or parts[0] != socket.gethostname():
        return False
    try:
        return abs(psutil.Process(int(parts[1])).create_time() - float(parts[2])) > 0.05
    except (psutil.NoSuchProcess, ValueError):
        return True


class Lease:
    """This process's claim on the lease. `fencing` is None until acquired."""

    def __init__(self, store: Store, clock: Clock, lease_s: float, holder: str | None = None) -> None:
        self.store, self.clock, self.lease_s = store, clock, lease_s
        self.holder = holder or new_holder()
        self.fencing: int | None = None
        self.renewed_at = 0.0

    @property
    def held(self) -> bool:
        return self.fencing is not None

    @property
    def poll_s(self) -> float:
        """How often a standby looks at the lease."""
        return min(1.0, self.lease_s / 5)

    def _row(self, conn: Connection) -> Any:
        row = conn.execute(select(T).where(T.c.name == NAME).with_for_update()).first()
        if row is None:
            ensure_row(self.store.engine)
            row = conn.execute(select(T).where(T.c.name == NAME).with_for_update()).one()
        return row

    def try_acquire(self) -> bool:
        """Take the lease if it is free, expired or held by a dead process of this host.
        True if this process holds it now (with a new fencing number)."""
        now = self.clock.now()
        with self.store.engine.begin() as conn:
            row = self._row(conn)
            if self.fencing is not None and row.holder == self.holder and row.fencing == self.fencing:
                self._renew(conn, now, cycled=False)
                return True
            if row.holder is not None and row.expires_at > now and not holder_gone(row.holder):
                return False
            res = conn.execute(update(T).where(T.c.name == NAME, T.c.fencing == row.fencing)
                               .values(holder=self.holder, fencing=row.fencing + 1, acquired_at=now,
                                       renewed_at=now, expires_at=now + self.lease_s))
            if res.rowcount != 1:
                return False  # another standby won the race
        self.fencing, self.renewed_at = row.fencing + 1, now
        return True

    def renew(self, *, cycled: bool = False) -> None:
        """Extend the lease by lease_s from now (and mark a finished cycle). Raises LeaseLost
        if another broker took it."""
        now = self.clock.now()
        with self.store.engine.begin() as conn:
            self._renew(conn, now, cycled)

    def _renew(self, conn: Connection, now: float, cycled: bool) -> None:
        values: dict[str, float] = {"renewed_at": now, "expires_at": now + self.lease_s}
        if cycled:
            values["cycled_at"] = now
        res = conn.execute(update(T).where(*self._mine()).values(**values))
        if res.rowcount != 1:
            self._lost(conn)
        self.renewed_at = now

    def ensure(self) -> None:
        """Before acting on the world: renew if the last renewal is lease_s / 3 old or more.
        Raises LeaseLost if another broker took it."""
        if self.fencing is None:
            raise LeaseLost("this broker does not hold the lease")
        if self.clock.now() - self.renewed_at >= self.lease_s / 3:
            self.renew()

    def check(self, conn: Connection, fencing: int | None) -> None:
        """The fence, inside the caller's transaction: raises LeaseLost unless the row still
        holds this holder and `fencing` (the number of the caller's term), and write-locks
        it until the commit."""
        if self.fencing is None or fencing != self.fencing:
            raise LeaseLost(f"this broker does not hold the lease with fencing number {fencing}")
        res = conn.execute(update(T).where(*self._mine()).values(fencing=self.fencing))
        if res.rowcount != 1:
            self._lost(conn)

    def release(self) -> None:
        """Give the lease up (a clean stop): a standby takes over at once."""
        if self.fencing is None:
            return
        with self.store.engine.begin() as conn:
            conn.execute(update(T).where(*self._mine()).values(holder=None, expires_at=0.0))
        self.fencing = None

    def _mine(self) -> tuple[Any, ...]:
        return (T.c.name == NAME, T.c.holder == self.holder, T.c.fencing == self.fencing)

    def _lost(self, conn: Connection) -> None:
        row = conn.execute(select(T).where(T.c.name == NAME)).first()
        mine, self.fencing = self.fencing, None
        who = f"{row.holder} holds it with fencing number {row.fencing}" if row else "it is gone"
        raise LeaseLost(f"lease lost: this broker had fencing number {mine}; {who}")


def lease_row(store: Store) -> Any:
    """The lease row as stored now (holder, fencing, expires_at, cycled_at, ...)."""
    ensure_row(store.engine)
    with store.engine.connect() as conn:
        return conn.execute(select(T).where(T.c.name == NAME)).one()


class FencedStore(StoreView):
    """The store as the leader sees it in one term (one fencing number): the same database,
    but every session that wrote anything checks the fence just before it commits
    (LeaseLost: rolled back). A later term of the same process is a new FencedStore, so
    work left over from an earlier term cannot write."""

    def __init__(self, store: Store, lease: Lease) -> None:
        self.inner, self.lease, self.fencing = store, lease, lease.fencing

    def ensure(self) -> None:
        """Before acting on the world: raises LeaseLost unless this term still leads
        (renewing the lease when due, see Lease.ensure)."""
        if self.lease.fencing != self.fencing:
            raise LeaseLost(f"the term with fencing number {self.fencing} is over")
        self.lease.ensure()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Like Store.session(), fenced."""
        with self.inner.session() as s:
            s.info[FENCE] = self
            yield s

    def dispose(self) -> None:
        self.inner.dispose()


FENCE, WROTE = "onepool_fence", "onepool_wrote"


@event.listens_for(Session, "after_flush")
def _flushed(session: Session, _ctx: Any) -> None:
    if FENCE in session.info:
        session.info[WROTE] = True


@event.listens_for(Session, "do_orm_execute")
def _executed(state: ORMExecuteState) -> None:
    if FENCE in state.session.info and (state.is_insert or state.is_update or state.is_delete):
        state.session.info[WROTE] = True


@event.listens_for(Session, "before_commit")
def _fence(session: Session) -> None:
    """The fence comes before the last flush: a term that is over gets LeaseLost even when its
    pending rows would collide with rows the newer leader wrote meanwhile (the checkpoint it
    indexed too), instead of an IntegrityError that looks like a bug. The check write-locks
    the lease row, so nothing can take over between it and the commit."""
    fenced = session.info.get(FENCE)
    if fenced is None:
        return
    checked = bool(session.info.get(WROTE) or session.new or session.deleted
                   or any(session.is_modified(o) for o in session.dirty))
    if checked:
        fenced.lease.check(session.connection(), fenced.fencing)
    session.flush()
    if session.info.pop(WROTE, False):
        if not checked:
            fenced.lease.check(session.connection(), fenced.fencing)
        crash_point("db_write")  # written and fenced, not committed


def ensure_row(engine: Any) -> None:
    """Create the lease row if the database has none (the migration creates it)."""
    try:
        with engine.begin() as conn:
            if conn.execute(select(T.c.name).where(T.c.name == NAME)).first() is None:
                conn.execute(insert(T).values(name=NAME, fencing=0, expires_at=0.0))
    except IntegrityError:  # another broker created it at the same moment
        pass

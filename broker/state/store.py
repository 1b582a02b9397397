"""Where state lives: a SQLite file under $ONEPOOL_HOME by default, any SQLAlchemy URL by
ONEPOOL_DATABASE_URL. The schema is created and upgraded by Alembic, never by create_all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, create_engine

from broker.errors import ReadOnly
from broker.state.schema_head import head_revision
from broker.state.wake import AGENTS_CHANNEL, AGENTS_FILE, Wake, notify

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

MIGRATIONS = Path(__file__).with_name("migrations")


def home_dir(home: str | os.PathLike[str] | None = None) -> Path:
    """The broker's home: `home`, else $ONEPOOL_HOME, else ./.onepool. Created readable by its
    owner only (job environments may hold secrets)."""
    p = Path(home or os.environ.get("ONEPOOL_HOME") or ".onepool").absolute()
    if not p.exists():
        p.mkdir(parents=True, mode=0o700)
        os.chmod(p, 0o700)  # mkdir's mode is masked by the umask
    return p


def database_url(home: Path) -> str:
    return os.environ.get("ONEPOOL_DATABASE_URL") or f"sqlite:///{home / 'onepool.db'}"


def make_engine(url: str) -> Engine:
    """An engine for `url`. SQLite gets WAL, a busy timeout and foreign keys, so the CLI and
    the broker can share the file, and synchronous=FULL, so a commit survives a power loss."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:" and not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # owner only, from the start
        # The API serves up to 40 requests at once (its thread pool) beside the engine.
        eng = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                            pool_size=8, max_overflow=48)

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn, _rec) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")  # whatever the build's default
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return eng
    return create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=40)


def alembic_config(engine: Engine) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent). A schema already at the newest
    revision is left alone without loading Alembic."""
    if current_revision(engine) == head_revision() is not None:
        return
    from alembic import command

    command.upgrade(alembic_config(engine), "head")


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: no schema yet)."""
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError:
        return None


class Store:
    """The database of one broker home. Opening it migrates the schema to head."""

    def __init__(self, home: str | os.PathLike[str] | None = None, url: str | None = None) -> None:
        self.home = home_dir(home)
        self.url = url or database_url(self.home)
        self.engine = make_engine(self.url)
        upgrade(self.engine)
        self.wake = Wake(self.home)
        self.agents_wake = Wake(self.home, AGENTS_FILE)

    def agents_changed(self) -> None:
        """An assignment or a signal for an agent was written: wake the agents' long polls
        served by API processes without a broker of their own (broker.state.wake)."""
        notify(self.engine, AGENTS_CHANNEL)
        self.agents_wake.poke()

    def changed(self) -> None:
        """The queue changed in a way that can change the plan (a submit, a cancel, a budget or
        a config): wake the broker loop now, in this process and, through the home's wake file
        or PostgreSQL's NOTIFY, in another (broker.state.wake). Call it after the commit."""
        notify(self.engine)
        self.wake.poke()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on any exception."""
        with Session(self.engine, expire_on_commit=False) as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()


READ_ONLY = "onepool_read_only"


class StoreView:
    """A store seen through a rule on its sessions (a subclass's `session()`): the same home,
    URL and engine as the store it wraps (`inner`)."""

    inner: Store

    @property
    def home(self) -> Path:
        return self.inner.home

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def engine(self) -> Engine:
        return self.inner.engine


class ReadOnlyStore(StoreView):
    """A store to compute on a snapshot (`onepool rebalance --dry-run`): the same database,
    but every session is rolled back when it ends, so whatever the computation writes on the
    way (a price first seen, an event) is not kept, and an explicit commit raises ReadOnly.
    It needs no lease: nothing it does reaches the database's history."""

    def __init__(self, store: Store) -> None:
        self.inner = store

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that is always rolled back at its end."""
        with Session(self.inner.engine, expire_on_commit=False) as s:
            s.info[READ_ONLY] = True
            try:
                yield s
            finally:
                s.rollback()

    def dispose(self) -> None:
        """Nothing to give back: the engine is the inner store's."""


@event.listens_for(Session, "before_commit")
def _refuse_commit(session: Session) -> None:
    if session.info.get(READ_ONLY):
        raise ReadOnly("a commit was attempted on a read-only snapshot of the database (a dry run "
                       "keeps nothing)")

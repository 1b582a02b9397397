"""A throwaway PostgreSQL server for the test suite and `make chaos`.

`PgServer.start()` finds Debian's server binaries (installing them with
`apt-get install -y postgresql` when none are found and we are root), makes a cluster with
initdb in a temporary folder, and starts it on a free port of 127.0.0.1 with durability off
(fsync, synchronous_commit, full_page_writes: a test cluster is thrown away). `stop()` stops
it and removes the folder. Nothing is left behind on this machine.

Each test gets its own database, copied from a template migrated once to head (a few ms),
and dropped WITH (FORCE) afterwards.

    python -m tests.postgres        # start one, print its URL, stop it on Enter
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

TEMPLATE = "onepool_template"


class PgUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says what to install."""


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parent.parent.name))
    return Path(versions[-1]).parent if versions else None


def ensure_installed() -> Path:
    """The folder holding initdb/pg_ctl. Installs Debian's postgresql when missing (as root).
    Raises PgUnavailable when it cannot."""
    found = _bin_dir()
    if found is not None:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise PgUnavailable("the tests need a PostgreSQL server: install it "
                            "(Debian: `apt-get install -y postgresql`) or run as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise PgUnavailable(f"apt-get install postgresql failed: {res.stderr[-500:]}")
    found = _bin_dir()
    if found is None:
        raise PgUnavailable("postgresql was installed but no initdb was found")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One running throwaway cluster. Use `start()`; always `stop()`."""

    def __init__(self, bin_dir: Path, root: Path, port: int, user: str | None) -> None:
        self.bin_dir, self.root, self.port, self.user = bin_dir, root, port, user
        self._n = itertools.count(1)
        self._template_ready = False

    @classmethod
    def start(cls) -> PgServer:
        bin_dir = ensure_installed()
        root = Path(tempfile.mkdtemp(prefix="onepool-pg-"))
        user = None
        if os.geteuid() == 0:  # initdb refuses root: run the cluster as the postgres user
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise PgUnavailable("running as root, but there is no 'postgres' user to run "
                                    "the server as") from None
            user = "postgres"
            os.chown(root, pw.pw_uid, pw.pw_gid)
        srv = cls(bin_dir, root, _free_port(), user)
        srv._run("initdb", "-D", str(root / "data"), "-A", "trust", "-U", "postgres",
                 "--no-sync", "-E", "UTF8", "--locale=C")
        opts = (f"-p {srv.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=400 "
                "-c shared_buffers=32MB")
        srv._run("pg_ctl", "-D", str(root / "data"), "-l", str(root / "server.log"), "-w",
                 "-o", opts, "start")
        return srv

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin_dir / tool), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, check=False)
        if res.returncode != 0:
            raise PgUnavailable(f"{tool} failed ({res.returncode}): {res.stderr[-800:]}")

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of a database on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self, name: str, *, migrated: bool = True) -> str:
        """A new database (empty, or at the newest migration); returns its URL."""
        if migrated and not self._template_ready:
            from broker.state.store import make_engine, upgrade

            self._admin(f'CREATE DATABASE "{TEMPLATE}"')
            eng = make_engine(self.url(TEMPLATE))
            upgrade(eng)
            eng.dispose()
            self._template_ready = True
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE if migrated else "template0"}"')
        return self.url(name)

    def fresh_database(self, *, migrated: bool = True) -> str:
        """A new uniquely named database; returns its URL."""
        return self.create_database(f"t{os.getpid()}_{next(self._n)}", migrated=migrated)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[-1]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    server = PgServer.start()
    try:
        print(server.create_database("onepool"), flush=True)
        input("PostgreSQL is up; press Enter to stop it and remove its files. ")
    finally:
        server.stop()

"""What a rank sees and who it runs as: jobs apart from the control plane and from each
other (issue 24). Used by providers.local for the server's local slots and for agent nodes.

- **Environment.** A rank gets a clean environment: a minimal PATH (the system's, with the
  directory of the broker's Python first), LANG, HOME, TMPDIR, USER, then the variables of
  this host that the operator named (`ONEPOOL_PASS_ENV` / `onepool agent --pass-env`, e.g. an
  object store's endpoint), then the job's (its spec's env plus the broker's ONEPOOL_*
  variables). Never the rest of the server's or the agent's environment, and never a host
  variable that starts with ONEPOOL_ (the database URL, a token).
- **User.** When this process is root, each rank runs as the user the host setting names
  for its team (`ONEPOOL_RUN_AS` / `onepool agent --run-as`: `USER`, `UID[:GID]`, or
  `TEAM=USER,...,*=USER`); with none named, as `nobody`. Root only when named explicitly.
  When this process is not root, ranks run as this process's user (it cannot switch).
- **Folders.** A rank's run folder (log, exit status, handle) stays the broker's and is
  unreadable to jobs. The job's own folder (its HOME, TMPDIR, default working directory and
  done marker; `ONEPOOL_JOB_DIR`) is owned by the rank's user, mode 0700; when ranks may run
  as other users it lives under `ONEPOOL_JOBS_DIR` (default /var/lib/onepool-jobs, 0711:
  others may pass, not list), so the server's home and the agent's state folder stay 0700;
  else it is the run folder's job/.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import os
import pwd
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from broker.spec_types import RUN_AS_HELP, parse_pass_env, parse_run_as

RUN_AS_ENV = "ONEPOOL_RUN_AS"
PASS_ENV_ENV = "ONEPOOL_PASS_ENV"
JOBS_DIR_ENV = "ONEPOOL_JOBS_DIR"
JOB_DIR_ENV = "ONEPOOL_JOB_DIR"
TEAM_ENV = "ONEPOOL_TEAM"
DEFAULT_JOBS_DIR = "/var/lib/onepool-jobs"
FALLBACK_USER = "nobody"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The broker's own tuning that a host may set for its ranks (not secrets).
HOST_BROKER_VARS = ("ONEPOOL_PROGRESS_EVERY_S",)


@dataclass(frozen=True)
class User:
    """A resolved account: what the supervisor switches to before it runs the job."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str | None  # its home folder when it exists and is its own, else None

    @classmethod
    def lookup(cls, spec: str) -> User:
        """`name`, or `uid[:gid]` (an account need not exist for a numeric uid). Raises
        ValueError naming `run_as` when the name is unknown on this host."""
        if spec[0].isdigit():
            uid, _, gid = spec.partition(":")
            try:
                pw: pwd.struct_passwd | None = pwd.getpwuid(int(uid))
            except KeyError:
                pw = None
            g = int(gid) if gid else (pw.pw_gid if pw else int(uid))
            return cls(pw.pw_name if pw else uid, int(uid), g, _groups(pw, g), _home(pw, int(uid)))
        try:
            pw = pwd.getpwnam(spec)
        except KeyError:
            raise ValueError(f"run_as: no user {spec!r} on this host: create it (e.g. `useradd "
                             f"--system onepool-job`) or name a numeric UID[:GID]") from None
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, _groups(pw, pw.pw_gid), _home(pw, pw.pw_uid))


def _groups(pw: pwd.struct_passwd | None, gid: int) -> tuple[int, ...]:
    """The user's supplementary groups (from /etc/group); none for an account-less uid."""
    if pw is None:
        return ()
    return tuple(sorted({g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem} - {gid}))


def _home(pw: pwd.struct_passwd | None, uid: int) -> str | None:
    if pw is None:
        return None
    try:
        return pw.pw_dir if os.stat(pw.pw_dir).st_uid == uid else None
    except OSError:
        return None


@dataclass
class Isolation:
    """This host's choice of user per team, the host variables passed to ranks, and where
    job folders live. `from_env()` reads the host settings; tests build one directly."""

    run_as: str | None = None  # the setting's text (see RUN_AS_HELP); None: the default
    pass_env: Sequence[str] = ()
    jobs_dir: Path = Path(DEFAULT_JOBS_DIR)
    root: bool = field(default_factory=lambda: os.geteuid() == 0)

    def __post_init__(self) -> None:
        self.default, self.teams = parse_run_as(self.run_as) if self.run_as else (None, {})
        self.pass_env = parse_pass_env(",".join(self.pass_env))
        self._users: dict[str, User] = {}
        self._rank_uids: frozenset[int] | None = None
        for spec in [*self.teams.values(), *([self.default] if self.default else [])]:
            self._user(spec)  # an unknown name fails now, at startup, not at a job's start
        if not self.root and self.run_as:
            me = pwd.getpwuid(os.geteuid()).pw_name
            others = sorted({u for u in [*self.teams.values(), self.default]
                             if u and self._user(u).uid != os.geteuid()})
            if others:
                raise ValueError(f"run_as: this process runs as {me}, not root: it cannot run "
                                 f"ranks as {', '.join(others)} (run it as root, or unset run_as)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, run_as: str | None = None,
                 pass_env: Sequence[str] = (), jobs_dir: Path | None = None) -> Isolation:
        """The host's settings: the arguments when given, else ONEPOOL_RUN_AS,
        ONEPOOL_PASS_ENV and ONEPOOL_JOBS_DIR of `environ` (this process's environment)."""
        e = os.environ if environ is None else environ
        return cls(run_as=run_as or e.get(RUN_AS_ENV) or None,
                   pass_env=list(pass_env) or parse_pass_env(e.get(PASS_ENV_ENV, "")),
                   jobs_dir=jobs_dir or Path(e.get(JOBS_DIR_ENV) or DEFAULT_JOBS_DIR))

    @classmethod
    def for_host(cls, source: str, **settings: Any) -> Isolation:
        """from_env(**settings) at a process's start: a bad setting raises SpecError naming
        `source` (the command) and the setting, before anything runs."""
        from broker.errors import SpecError

        try:
            return cls.from_env(**settings)
        except ValueError as e:
            raise SpecError(source, [str(e)]) from None

    @property
    def drops(self) -> bool:
        """Whether ranks may run as another user than this process (it is root)."""
        return self.root

    @property
    def rank_uids(self) -> frozenset[int]:
        """Every uid other than this process's that a rank may run as here (nothing when not
        root): the processes `providers.local` may end as a dead supervisor's leftovers."""
        if not self.root:
            return frozenset()
        if self._rank_uids is None:
            specs = [*self.teams.values(), self.default or FALLBACK_USER]
            self._rank_uids = frozenset(self._user(s).uid for s in specs) - {os.geteuid()}
        return self._rank_uids

    def _user(self, spec: str) -> User:
        if spec not in self._users:
            self._users[spec] = User.lookup(spec)
        return self._users[spec]

    def user_for(self, team: str | None) -> User | None:
        """Who a rank of `team` runs as; None: as this process (not root, nothing to drop)."""
        if not self.root:
            return None
        spec = self.teams.get(team or "") or self.default or FALLBACK_USER
        return self._user(spec)

    def job_dir(self, run_dir: Path) -> Path:
        """The job's own folder for the rank whose run folder is `run_dir`."""
        if not self.rank_uids:  # every rank runs as this process's user: it stays in the run folder
            return run_dir / "job"
        return self.jobs_dir / hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:24]

    def prepare(self, run_dir: Path, user: User | None) -> Path:
        """Make the rank's folders: its run folder the broker's (0700), its job folder the
        rank user's (0700, with tmp/ inside). Returns the job folder."""
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(run_dir, 0o700)
        jd = self.job_dir(run_dir)
        if jd.parent == self.jobs_dir:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.jobs_dir, 0o711)  # the users pass through to their own folder only
        owned_dirs(jd.parent, [jd.name, "tmp"], user)
        return jd

    def remove(self, run_dir: Path) -> None:
        """Remove the job folder of a rank that has ended (its tmp files, its HOME)."""
        jd = self.job_dir(run_dir)
        if jd.exists() and jd != run_dir:
            shutil.rmtree(jd, ignore_errors=True)

    def env(self, job_env: Mapping[str, str], user: User | None, job_dir: Path,
            host: Mapping[str, str] | None = None) -> dict[str, str]:
        """The rank's whole environment (see the module's docstring)."""
        h = os.environ if host is None else host
        name = user.name if user is not None else pwd.getpwuid(os.geteuid()).pw_name
        home = (user.home if user is not None else h.get("HOME")) or str(job_dir)
        base = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}", "LANG": "C.UTF-8",
                "HOME": home, "TMPDIR": str(job_dir / "tmp"), "USER": name, "LOGNAME": name}
        passed = {k: h[k] for k in [*self.pass_env, *HOST_BROKER_VARS]
                  if k in h and (k in HOST_BROKER_VARS or not k.startswith("ONEPOOL_"))}
        return {**base, **passed, **job_env, JOB_DIR_ENV: str(job_dir)}

    def prepare_store(self, uri: str | None, team: str | None, user: User | None) -> None:
        """A rank that drops privileges and checkpoints into a file store on this host gets
        the store's team folder as its own (0700), and the job's prefix below it. The store's
        root is left as it is (the operator makes it reachable: an admin who names a store
        cannot change a folder's mode through this). An object store needs nothing (the job
        reaches it with the credentials passed to it)."""
        if user is None or not uri or not team:
            return
        u = urlparse(uri)
        if u.scheme not in ("", "file"):
            return
        prefix = Path(u.path if u.scheme else uri)
        parts = prefix.parts
        if team not in parts:
            return
        at = len(parts) - 1 - parts[::-1].index(team)
        root = Path(*parts[:at])  # its mode is the operator's: rank users must pass through it
        root.mkdir(parents=True, exist_ok=True)
        owned_dirs(root, list(parts[at:]), user)


def owned_dirs(base: Path, names: list[str], user: User | None) -> None:
    """Make base/names[0]/names[1]/... (existing ones kept), each owned by `user` (when
    given) with mode 0700. Walks by directory descriptors and never follows a symbolic
    link: a job that owns one of these folders cannot redirect the broker's chown or chmod
    elsewhere (raises OSError if it tried)."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if user is not None:
                os.fchown(fd, user.uid, user.gid)
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


__all__ = ["RUN_AS_HELP", "Isolation", "User"]

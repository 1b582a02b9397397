"""The embedded default: each rank of an attempt is a real process tree on this machine,
under a supervisor (providers.local_runner) that outlives the broker.

GPU slots are handed over through CUDA_VISIBLE_DEVICES; several local pools with different
GPU types emulate a heterogeneous on-prem cluster on one host. See providers.base for the
Executor contract this implements.

Containment (no process outlives its attempt). A rank's processes are found three ways,
all of which survive the death of its supervisor:
- its cgroup (cgroup v2, where this host lets us create one): the supervisor joins
  `<cgroup2>/onepool/<rank id>` before it starts the job, every descendant is born inside,
  and `cgroup.kill` kills them all, including ones that left the process group;
- its process group (the supervisor leads a new session; the group id is recorded in the
  handle); a group id cannot be reused while any member lives;
- the environment tag ONEPOOL_RANK_DIR (the rank's run folder, unique across attempts and
  broker homes) that every descendant inherits (checked before a process is adopted or
  killed, so a reused pid or another home's job is never touched).
The supervisor is a child subreaper: orphaned descendants are re-parented to it, and when the
job's main process exits it kills what is left before it writes the exit status. If the
supervisor itself dies, the job's main process gets SIGKILL (PR_SET_PDEATHSIG), status()
reports ORPHANED while anything of the rank lives; the engine kills it (signal SIGKILL) and
only then ends the attempt, so no new attempt of the job starts beside a process of the old
one. When ranks run as other users (this process is root, see providers.isolation), this
process is a child subreaper too: what a dead supervisor leaves comes to it, tagged or not,
in a session of its own or not, and is killed by its uid (_end_adopted).

Images (providers.container): a rank whose environment names ONEPOOL_IMAGE runs in a
container; start() resolves this host's runtime (a node without one is a start failure of
kind no_container_runtime) and hands the supervisor the `run` command line; status() removes a
container its dead supervisor left.

Isolation (providers.isolation): the supervisor gets the broker's environment, never the
job's (it may stay root); the job's environment, working directory and user reach it in a
launch file (0600, read once and deleted), and its child switches to that user before exec.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from broker.output_log import CAP_ENV
from providers import container, rank_prep, start_errors
from providers.base import Handle, RankState, RankStatus, StartFailed
from providers.code_cache import CodeCache
from providers.data_cache import DATA_ENV, DataCache
from providers.image_pull import HeldImages
from providers.isolation import TEAM_ENV, Isolation
from providers.local_runner import LAUNCH_FILE, set_subreaper

ATTEMPT_ENV = "ONEPOOL_ATTEMPT_ID"
RANK_ENV = "ONEPOOL_RANK"
TAG_ENV = "ONEPOOL_RANK_DIR"  # the rank's run folder: unique across attempts and broker homes
CGROUP_ENV = "ONEPOOL_CGROUP"  # the cgroup the supervisor joins (set by start())
# The supervisor's interpreter ignores the PYTHON* variables of the job's environment (-E: a
# job's PYTHONHOME must not kill its supervisor before it can record anything) and the job's
# working directory (-P); it runs the code of this very checkout, wherever that is.
SUPERVISOR = ("-E", "-P", "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r}); "
              "from providers.local_runner import main; sys.exit(main(sys.argv[1:]))")
# The supervisor's own environment: the broker's, never the job's (it may stay root).
SUPERVISOR_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUPERVISOR_VARS = ("ONEPOOL_AGENT_LEASE", "ONEPOOL_AGENT_FENCE_S", "ONEPOOL_AGENT_FENCE_GRACE_S",
                   "ONEPOOL_GRACE_S", CAP_ENV)


def cgroup_root() -> Path | None:
    """`<cgroup2 mount><our cgroup>/onepool` if cgroup v2 lets this process create and kill
    cgroups there (root, or a delegated subtree), else None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::")), "/")
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            root = Path(parts[1]) / own.strip().lstrip("/") / "onepool"
            try:
                root.mkdir(exist_ok=True)
            except OSError:
                continue
            if (root / "cgroup.kill").exists() and os.access(root / "cgroup.procs", os.W_OK):
                return root
    return None


class LocalProcesses:
    """Runs ranks under providers.local_runner, one folder per rank under `runs_dir`.

    containment: "auto" (a cgroup when available, else process group + environment tag),
    "cgroup" (required: raises StartFailed where unavailable), "group" (never a cgroup).
    """

    def __init__(self, runs_dir: str | os.PathLike[str],
                 on_change: Callable[[], None] | None = None, containment: str = "auto",
                 isolation: Isolation | None = None, code_cache: CodeCache | None = None) -> None:
        self.runs_dir = Path(runs_dir)
        # unpacked code snapshots (issue 26), shared by the ranks of this folder's parent
        self.code = code_cache or CodeCache(self.runs_dir.parent / "code-cache")
        self.data = DataCache(self.runs_dir.parent / "data-cache",
                              in_use=lambda: rank_prep.data_in_use(self.runs_dir))
        self.images = HeldImages(container.node_runtime)  # what this node's runtime holds (agents report it)
        self.iso = isolation if isolation is not None else Isolation.from_env()
        self._rank_uids = self.iso.rank_uids
        if self._rank_uids:  # a dead supervisor's processes come to us (see _end_adopted)
            set_subreaper()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._changed = threading.Event()
        self._on_change = on_change
        self._final: dict[str, RankStatus] = {}  # run dir -> status once nothing of it lives
        self._start_lock = threading.Lock()
        if containment not in ("auto", "cgroup", "group"):
            raise ValueError(f"containment must be auto, cgroup or group (got {containment!r})")
        self.cgroups = None if containment == "group" else cgroup_root()
        if containment == "cgroup" and self.cgroups is None:
            raise StartFailed("containment: cgroup v2 is not available to this process")

    def run_dir(self, attempt_id: int, rank: int) -> Path:
        return self.runs_dir / f"attempt-{attempt_id}" / f"rank-{rank}"

    def cgroup_of(self, run_dir: Path) -> Path | None:
        if self.cgroups is None:
            return None
        return self.cgroups / hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:20]

    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False, node: str | None = None) -> Handle:
        """Start the rank unless it was started already; return its handle.

        With recover=True (after a broker crash) it also looks for a live process carrying
        this attempt and rank in its environment, covering a crash between spawn and the
        supervisor's first write. Raises StartFailed (its `cause` from providers.start_errors)
        when the rank cannot be started: a working directory that does not exist or is not a
        directory, a NUL byte in its command or environment, arguments or environment too
        large (E2BIG). A command that cannot be executed is the supervisor's to record (in
        exit.json: status() then carries the cause). An OSError of this host's own (its runs
        folder) propagates as is.
        """
        d = self.run_dir(attempt_id, rank)
        with self._start_lock:
            found = self._existing(d, attempt_id, rank, recover)
            if found is not None:
                return found
            cg = self.cgroup_of(d)
            tags = {ATTEMPT_ENV: str(attempt_id), RANK_ENV: str(rank), TAG_ENV: str(d.resolve())}
            sup_env = {"PATH": SUPERVISOR_PATH, "LANG": "C.UTF-8", **tags,
                       **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},
                       **{k: env[k] for k in SUPERVISOR_VARS if k in env}}
            cwd = env.get("ONEPOOL_WORKDIR") or None
            d.mkdir(parents=True, exist_ok=True)  # an OSError here is this host's, not the job's
            if cwd is not None and (kind := start_errors.workdir_kind(cwd)) is not None:
                raise StartFailed(f"rank {rank} could not start: {start_errors.describe(kind)}: {cwd!r}",
                                  cause=start_errors.cause(kind))
            try:
                user = self.iso.user_for(env.get(TEAM_ENV))
                job_dir = self.iso.prepare(d, user)
                # its code (a private copy), data and setup (issue 26), each phase timed
                prep = rank_prep.prepare(self.code, self.data, env, job_dir, user, workdir=cwd,
                                         markers=self.runs_dir.parent / "setup-cache")
                cwd, argv = prep.cwd, [*prep.argv_prefix, *argv]
                _write_json(d / rank_prep.PHASES_FILE, prep.phases)
                if prep.data_keys:
                    _write_json(d / rank_prep.DATA_FILE, {"keys": prep.data_keys})
                self.iso.prepare_store(env.get("ONEPOOL_CHECKPOINT_URI"), env.get(TEAM_ENV), user)
                if cg is not None:
                    cg.mkdir(exist_ok=True)
                    sup_env[CGROUP_ENV] = str(cg)
                bad = [k for k, v in env.items() if "\x00" in k or "\x00" in v]
                if bad:  # the supervisor would fail to start the job: fail here, with the reason
                    raise ValueError(f"environment variable {bad[0]!r} holds a null byte")
                launch = {"env": self.iso.env({**env, **tags}, user, job_dir), "cwd": cwd or str(job_dir),
                          "user": None if user is None else [user.uid, user.gid, list(user.groups)]}
                if env.get(container.IMAGE_ENV):  # the runtime's CLI runs it, as the rank's user
                    launch["container"] = container.plan(
                        d, argv, env, launch, job_dir, tags, prep.image_setup,
                        read_only=[str(self.data.root)] if env.get(DATA_ENV) else [])
                    launch["user"] = None
                _write_private(d / LAUNCH_FILE, launch)
                with open(d / "output.log", "ab") as log:
                    p = subprocess.Popen(
                        [sys.executable, *SUPERVISOR, str(d), "--", *argv],
                        env=sup_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True, cwd=d)
            except container.ContainerSetupError as e:  # this node's runtime, or the env it cannot carry
                if cg is not None:
                    _rmdir(cg)
                raise StartFailed(f"rank {rank} could not start: {start_errors.describe(e.kind)}: {e}",
                                  cause=start_errors.cause(e.kind)) from e
            except StartFailed:
                if cg is not None:
                    _rmdir(cg)
                raise
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                if cg is not None:
                    _rmdir(cg)
                kind = start_errors.classify(e, sys.executable)
                raise StartFailed(f"rank {rank} could not start: {start_errors.describe(kind)}: {e}",
                                  cause=start_errors.cause(kind)) from e
            self._children[p.pid] = p
            handle = {"rank": rank, "pid": p.pid, "create_time": _create_time(p.pid), "pgid": p.pid,
                      "attempt_id": attempt_id, "run_dir": str(d), "cgroup": None if cg is None else str(cg)}
            _write_json(d / "spawned.json", handle)  # found by a restarted broker, like handle.json
        threading.Thread(target=self._reap, args=(p, d), daemon=True).start()
        return handle

    def _reap(self, p: subprocess.Popen[bytes], d: Path) -> None:
        """Wait for a supervisor. One that exited by itself (not by a signal) without recording
        anything never got to start the job (it failed to start itself): its rank ends as a
        start failure, instead of LOST without a status (which would requeue it without end)."""
        code = p.wait()
        if code > 0 and not (d / "handle.json").exists() and not (d / "exit.json").exists():
            why = f"its supervisor exited with status {code} before it could start the job (see its log)"
            with contextlib.suppress(OSError):
                _write_json(d / "exit.json", {"code": code, "start_error": start_errors.record(
                    "supervisor_failed", None, why)})
        self._children.pop(p.pid, None)
        self._changed.set()
        if self._on_change is not None:
            self._on_change()

    def wait_for_change(self, timeout: float) -> bool:
        """Block until a rank started by this object exits, or timeout. True if one did."""
        hit = self._changed.wait(timeout)
        self._changed.clear()
        return hit

    def sweep(self) -> None:
        """Remove the (empty) cgroups of this folder's ranks that have nothing alive."""
        for d in self.runs_dir.glob("attempt-*/rank-*"):
            cg = self.cgroup_of(d)
            h = self.adopt(int(d.parent.name.split("-")[1]), int(d.name.split("-")[1]))
            if cg is not None and cg.exists() and (h is None or not _alive(h)):
                _rmdir(cg)

    def adopt(self, attempt_id: int, rank: int) -> Handle | None:
        """The handle of a rank started earlier (by any broker process), None if it never
        started."""
        return self._existing(self.run_dir(attempt_id, rank), attempt_id, rank, recover=True)

    def _existing(self, d: Path, attempt_id: int, rank: int, recover: bool) -> Handle | None:
        base = {"rank": rank, "attempt_id": attempt_id, "run_dir": str(d),
                "cgroup": None if self.cgroup_of(d) is None else str(self.cgroup_of(d))}
        for name in ("handle.json", "spawned.json"):
            h = _read_json(d / name)
            if h is not None:
                return {**base, "pid": h["pid"], "create_time": h["create_time"],
                        "pgid": h.get("pgid", h["pid"])}
        if (d / "exit.json").exists() or (d / "done.json").exists():
            return {**base, "pid": -1, "create_time": 0.0, "pgid": -1}
        if recover:
            for proc in _tagged(d):
                leader = _group_leader(proc)
                return {**base, "pid": leader.pid, "create_time": leader.create_time(),
                        "pgid": leader.pid}
        return None

    def phases(self, handle: Handle) -> dict[str, float | bool] | None:
        """The rank's restart phases so far (broker.phases; None: none recorded)."""
        return rank_prep.read_phases(Path(handle["run_dir"]), self.iso.job_dir(Path(handle["run_dir"])))

    def status(self, handle: Handle) -> RankStatus:
        """RUNNING while its supervisor lives; ORPHANED when the supervisor is gone but a
        process of the rank still lives (kill it with signal(SIGKILL)); then EXITED with the
        code the supervisor recorded, or LOST. A job that declared itself done
        (runtime.done()) EXITED 0 if its supervisor recorded no code or a death by a signal
        that came after (its node's fence, a stop): its work is finished. A rank the
        supervisor's fence stopped carries the cause "fenced" (the platform ended it); one that
        could not be started at all, its `start_failed:<kind>` (providers.start_errors)."""
        d = handle["run_dir"]
        if d in self._final:
            return self._final[d]
        if _alive(handle) or handle.get("pid") in self._children:  # (not reaped yet: see _reap)
            return RankStatus(RankState.RUNNING)
        self._end_adopted()  # its supervisor is dead, so what it left has come to us by now
        if self._leftovers(handle):
            return RankStatus(RankState.ORPHANED)
        cg = handle.get("cgroup")
        if cg:
            _rmdir(Path(cg))
        ex = _read_json(Path(d) / "exit.json")
        if (self.iso.job_dir(Path(d)) / "done.json").exists():  # runtime.done(), as the job's user
            _write_json(Path(d) / "done.json", {"in": "job folder"})  # kept once that folder goes
        if (ex is None or int(ex["code"]) > 128) and (Path(d) / "done.json").exists():
            ex = {"code": 0}  # the job said it finished (runtime.done()); then it was killed
        cause = ex.get("cause") or (ex.get("start_error") or {}).get("cause") if ex else None
        container.remove(Path(d))  # a container its supervisor could not remove (it died)
        self.iso.remove(Path(d))
        final = (RankStatus(RankState.LOST) if ex is None else
                 RankStatus(RankState.EXITED, int(ex["code"]), cause=cause))
        self._final[d] = final
        return final

    def signal(self, handle: Handle, sig: int) -> None:
        """Signal the rank: its supervisor's process group while the supervisor lives (the
        job handles SIGTERM/SIGUSR1; the supervisor ignores them). SIGKILL kills everything of
        the rank wherever it is (cgroup, group, tag). Quietly nothing if it is gone."""
        if sig == signal.SIGKILL:
            self.kill(handle)
            return
        if not _alive(handle):
            return
        try:
            os.killpg(handle.get("pgid", handle["pid"]), sig)
        except ProcessLookupError:
            return

    def kill(self, handle: Handle) -> None:
        """SIGKILL every process of the rank: its cgroup, the descendants of its supervisor
        (a subreaper: those that left its session too), its process group, its tagged ones."""
        cg = handle.get("cgroup")
        if cg and (Path(cg) / "cgroup.kill").exists():
            with contextlib.suppress(OSError):  # gone meanwhile: the sweeps below still run
                (Path(cg) / "cgroup.kill").write_text("1")
        if _alive(handle):
            _kill_descendants(handle["pid"])  # before the group's SIGKILL takes the supervisor
            with contextlib.suppress(ProcessLookupError):
                os.killpg(handle.get("pgid", handle["pid"]), signal.SIGKILL)
        for p in self._leftovers(handle):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                continue
        self._end_adopted()

    def _end_adopted(self) -> None:
        """SIGKILL every process of a rank user (Isolation.rank_uids) that was re-parented to
        this process, with its descendants, and reap them. Only when ranks run as other users:
        this process is then a child subreaper, and the only processes of a rank user that can
        become its children are those of a rank whose supervisor died (a live supervisor is a
        subreaper too, nearer to them). So a process that left its session and cleared its
        environment dies with its supervisor, cgroup or not, as long as the broker or agent
        lives. Processes of other users (a database server this process started) are left."""
        if not self._rank_uids:
            return
        for child in psutil.Process().children():
            try:
                if child.uids().real not in self._rank_uids or child.pid in self._children:
                    continue
                family = [child, *child.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in family:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            with contextlib.suppress(ChildProcessError):  # ours now: reap it (now or next time)
                os.waitpid(child.pid, os.WNOHANG)

    def kill_all(self) -> int:
        """Kill every rank under `runs_dir` that still has a live process (a node going away,
        test teardown), as kill() does. Returns how many it found alive."""
        n = 0
        for d in self.runs_dir.glob("attempt-*/rank-*"):
            try:
                h = self.adopt(int(d.parent.name.split("-")[1]), int(d.name.split("-")[1]))
            except ValueError:
                continue
            if h is not None and (_alive(h) or self._leftovers(h)):
                n += 1
                self.kill(h)
        return n

    def _leftovers(self, handle: Handle) -> list[psutil.Process]:
        """Live (non-zombie) processes of the rank other than its supervisor."""
        found: dict[int, psutil.Process] = {}
        cg = handle.get("cgroup")
        if cg:
            try:
                pids = [int(x) for x in (Path(cg) / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    found[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    continue
        pgid = handle.get("pgid", handle.get("pid", -1))
        tagged = _tagged(Path(handle["run_dir"]))
        found.update({p.pid: p for p in tagged})
        if pgid > 0 and tagged and any(_pgid(p) == pgid for p in tagged):
            # the group is ours (a tagged member is in it): its untagged members are ours too
            for p in psutil.process_iter():
                if _pgid(p) == pgid:
                    found[p.pid] = p
        me = os.getpid()
        return [p for pid, p in found.items() if pid != me and _running(p)]


def _kill_descendants(pid: int) -> None:
    """SIGKILL every descendant of `pid`, again while new ones appear (one may fork meanwhile)."""
    for _ in range(10):
        try:
            procs = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        live = [p for p in procs if _running(p)]
        if not live:
            return
        for p in live:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def _tagged(run_dir: Path) -> list[psutil.Process]:
    """Live processes whose environment names this rank's run folder."""
    tag = str(run_dir.resolve())
    out = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
        if env.get(TAG_ENV) == tag and proc.pid != os.getpid() and _running(proc):
            out.append(proc)
    return out


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pgid(p: psutil.Process) -> int:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return -1


def _create_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:  # it already exited: no live process can match this handle
        return 0.0


def _alive(handle: Handle) -> bool:
    """Whether the rank's supervisor (the handle's pid, at its create time) is alive."""
    pid = handle.get("pid", -1)
    if pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - float(handle["create_time"])) > 0.01:
            return False  # the pid was reused by another process
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group_leader(proc: psutil.Process) -> psutil.Process:
    try:
        return psutil.Process(os.getpgid(proc.pid))
    except (ProcessLookupError, psutil.NoSuchProcess):
        return proc


def _rmdir(cg: Path) -> None:
    with contextlib.suppress(OSError):  # not empty yet, or already gone: tried again later
        cg.rmdir()


def _write_private(path: Path, data: dict) -> None:
    """Write JSON readable by this process's user only (it holds the job's environment)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    tmp.replace(path)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

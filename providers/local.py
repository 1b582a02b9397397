"""The embedded default: each rank of an attempt is a real process group on this machine.

GPU slots are handed over through CUDA_VISIBLE_DEVICES; several local pools with different
GPU types emulate a heterogeneous on-prem cluster on one host. See providers.base for the
Executor contract this implements.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from providers.base import Handle, RankState, RankStatus

ATTEMPT_ENV = "ONEPOOL_ATTEMPT_ID"
RANK_ENV = "ONEPOOL_RANK"
RUNS_ENV = "ONEPOOL_RUNS_DIR"  # which LocalProcesses started it (attempt ids are per broker)


class LocalProcesses:
    """Runs ranks under providers.local_runner, one folder per rank under `runs_dir`."""

    def __init__(self, runs_dir: str | os.PathLike[str],
                 on_change: Callable[[], None] | None = None) -> None:
        self.runs_dir = Path(runs_dir)
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._changed = threading.Event()
        self._on_change = on_change

    def run_dir(self, attempt_id: int, rank: int) -> Path:
        return self.runs_dir / f"attempt-{attempt_id}" / f"rank-{rank}"

    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False, node: str | None = None) -> Handle:
        """Start the rank unless it was started already; return its handle.

        With recover=True (after a broker crash) it also looks for a live process carrying
        this attempt and rank in its environment, covering a crash between spawn and the
        runner's first write.
        """
        d = self.run_dir(attempt_id, rank)
        found = self._existing(d, attempt_id, rank, recover)
        if found is not None:
            return found
        d.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **env, ATTEMPT_ENV: str(attempt_id), RANK_ENV: str(rank),
                    RUNS_ENV: str(self.runs_dir)}
        with open(d / "output.log", "ab") as log:
            p = subprocess.Popen(
                [sys.executable, "-m", "providers.local_runner", str(d), "--", *argv],
                env=full_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=env.get("ONEPOOL_WORKDIR") or None,
            )
        self._children[p.pid] = p
        threading.Thread(target=self._reap, args=(p,), daemon=True).start()
        return {"rank": rank, "pid": p.pid, "create_time": psutil.Process(p.pid).create_time(),
                "run_dir": str(d)}

    def find(self, attempt_id: int, rank: int) -> Handle | None:
        """The handle of a rank started before (alive or exited), or None; never starts one."""
        return self._existing(self.run_dir(attempt_id, rank), attempt_id, rank, recover=True)

    def _reap(self, p: subprocess.Popen[bytes]) -> None:
        p.wait()
        self._children.pop(p.pid, None)
        self._changed.set()
        if self._on_change is not None:
            self._on_change()

    def wait_for_change(self, timeout: float) -> bool:
        """Block until a rank started by this object exits, or timeout. True if one did."""
        hit = self._changed.wait(timeout)
        self._changed.clear()
        return hit

    def _existing(self, d: Path, attempt_id: int, rank: int, recover: bool) -> Handle | None:
        h = _read_json(d / "handle.json")
        if h is not None:
            return {"rank": rank, "pid": h["pid"], "create_time": h["create_time"], "run_dir": str(d)}
        if (d / "exit.json").exists():
            return {"rank": rank, "pid": -1, "create_time": 0.0, "run_dir": str(d)}
        if recover:
            for proc in psutil.process_iter(["pid", "create_time"]):
                try:
                    env = proc.environ()
                except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue
                if (env.get(ATTEMPT_ENV) == str(attempt_id) and env.get(RANK_ENV) == str(rank)
                        and env.get(RUNS_ENV) == str(self.runs_dir)):
                    if proc.pid == os.getpid():
                        continue
                    leader = _group_leader(proc)
                    return {"rank": rank, "pid": leader.pid,
                            "create_time": leader.create_time(), "run_dir": str(d)}
        return None

    def status(self, handle: Handle) -> RankStatus:
        d = Path(handle["run_dir"])
        if _alive(handle):
            return RankStatus(RankState.RUNNING)
        ex = _read_json(d / "exit.json")
        if ex is not None:
            return RankStatus(RankState.EXITED, int(ex["code"]))
        return RankStatus(RankState.LOST)

    def signal(self, handle: Handle, sig: int) -> None:
        """Signal the rank's whole process group; quietly nothing if it is gone."""
        if not _alive(handle):
            return
        try:
            os.killpg(handle["pid"], sig)
        except ProcessLookupError:
            return

    def kill(self, handle: Handle) -> None:
        self.signal(handle, signal.SIGKILL)

    def kill_all(self) -> int:
        """SIGKILL the process group of every rank under `runs_dir` still alive (a node going
        away, test teardown). Returns how many it found alive."""
        n = 0
        for h in self.runs_dir.glob("attempt-*/rank-*/handle.json"):
            data = _read_json(h)
            if data is None:
                continue
            handle = {"pid": data["pid"], "create_time": data["create_time"], "run_dir": str(h.parent)}
            if _alive(handle):
                n += 1
                self.signal(handle, signal.SIGKILL)
        return n


def _alive(handle: Handle) -> bool:
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


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

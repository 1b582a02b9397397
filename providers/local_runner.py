"""The supervisor of one local rank: `python -m providers.local_runner RUN_DIR -- ARGV...`.

It is the leader of the rank's process group (the broker signals the whole group). The
child's output (stdout and stderr) goes through a pipe into the rank's capped log
(broker.output_log: at most $ONEPOOL_OUTPUT_CAP_BYTES, the tail kept), so no job fills the
disk it runs on. First it joins the rank's cgroup when the broker made one ($ONEPOOL_CGROUP)
and becomes a child subreaper, so every descendant of the job stays findable (see
providers.local). It records `handle.json` (pid, create time, group, cgroup) as soon as it
starts and `exit.json` (the child's exit code) the moment the child ends, both by atomic
rename, so a restarted broker can tell a finished rank (exit.json) from a running one (live
pid) from a lost one (neither).
A rank it stopped itself because its node lost contact with the server (the fence, below)
is recorded with `"cause": "fenced"`: the platform ended it, not the job. A child that cannot
be started at all (no such command, exec format error, E2BIG, ...) is recorded with exit code
126/127 and a `start_error` ({cause, errno, message}, see providers.start_errors).
Then it ends whatever the job left behind (SIGTERM, 2 s, SIGKILL) before it exits itself:
no process outlives its rank. It survives the broker: it runs in its own session.
A job with an image (providers.container): it pulls the image (timed, providers.image_pull; a
failure is a start failure with its cause) and runs the container runtime's `run` in place of
the command, as itself (the container takes the rank's user); the runtime's signal proxy and
the container's init pass SIGTERM and SIGUSR1 to the job. A SIGTERM that comes during the pull
(it stops the pull too: the pull is in the group) ends the rank before the container starts
(143). Status 125 (the runtime's own failure) is recorded as `start_failed:container_failed`.
The container is removed before the supervisor exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from broker.output_log import CAP_ENV, DEFAULT_CAP, CappedOutput
from providers import container, start_errors
from providers.image_pull import PullFailed

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)
LAUNCH_FILE = "launch.json"  # written by providers.local (0600): the job's env, cwd and user
CONTAINER_FAILED = 125  # podman's and docker's own status when they could not run the container


def write_json(path: Path, data: dict[str, object]) -> None:
    """Write JSON atomically (temp file, fsync, rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _wait(child: subprocess.Popen[bytes], out: CappedOutput) -> tuple[int, bool]:
    """The child's exit status, and whether the fence stopped it. Under a node agent
    (ONEPOOL_AGENT_LEASE names the lease file the agent touches after every sync with the
    server), a lease older than ONEPOOL_AGENT_FENCE_S stops the child (SIGTERM, then SIGKILL
    after ONEPOOL_GRACE_S or ONEPOOL_AGENT_FENCE_GRACE_S, whichever is shorter): the broker
    will soon count this node lost and run the work elsewhere, so it must not run here too
    (broker.control.agents.Timing)."""
    lease = os.environ.get("ONEPOOL_AGENT_LEASE")
    if not lease:
        return child.wait(), False
    fence_s = float(os.environ.get("ONEPOOL_AGENT_FENCE_S", "160"))
    grace_s = float(os.environ.get("ONEPOOL_GRACE_S", "30"))
    if "ONEPOOL_AGENT_FENCE_GRACE_S" in os.environ:  # dead before the broker places it elsewhere
        grace_s = min(grace_s, float(os.environ["ONEPOOL_AGENT_FENCE_GRACE_S"]))
    while True:
        try:
            return child.wait(timeout=1.0), False
        except subprocess.TimeoutExpired:
            pass
        try:
            age = time.time() - os.stat(lease).st_mtime
        except FileNotFoundError:
            age = float("inf")
        if age > fence_s:
            out.append(f"onepool: no contact with the server for {age:.0f}s (fence {fence_s:g}s): "
                       "stopping this rank\n".encode())
            child.send_signal(signal.SIGTERM)
            try:
                return child.wait(timeout=grace_s), True
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait(), True


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m providers.local_runner RUN_DIR -- ARGV...", file=sys.stderr)
        return 2
    run_dir, cmd = Path(argv[0]), argv[2:]
    cgroup = join_cgroup(os.environ.pop("ONEPOOL_CGROUP", None))
    set_subreaper()
    me = psutil.Process()
    write_json(run_dir / "handle.json", {"pid": me.pid, "create_time": me.create_time(),
                                         "pgid": os.getpgid(0), "cgroup": cgroup})
    # The group gets SIGTERM and SIGUSR1 ("checkpoint now"); the child handles them. This
    # supervisor only waits (a Python handler, unlike SIG_IGN, is reset to the default in
    # the child at exec).
    # A signal that comes before the job exists (a cancel or a preemption right after the
    # start, while this supervisor reads its launch file) is passed on once the job runs:
    # otherwise the job would never hear it and run on until the broker's grace ran out.
    early: list[int] = []
    started: list[bool] = []

    def hold(sig: int, _frame: object) -> None:
        if not started:
            early.append(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, hold)
    fenced, failed = False, None
    cap = os.environ.pop(CAP_ENV, "")
    out = CappedOutput(run_dir, int(cap) if cap.isdigit() else DEFAULT_CAP)
    copier: threading.Thread | None = None
    try:
        opts = launch_options(run_dir)
    except (OSError, ValueError, KeyError) as e:
        print(f"onepool: cannot read this rank's launch file: {e}", file=sys.stderr)
        write_json(run_dir / "exit.json", {"code": 126, "start_error": start_errors.record(
            "supervisor_failed", e, f"cannot read this rank's launch file: {e}")})
        return 126
    plan = opts.pop("container", None)
    child: subprocess.Popen[bytes] | None = None
    try:
        if plan is not None:  # an image (providers.container): pull it, then run it
            cmd = container.prepare(run_dir, plan, lambda text: out.append(text.encode()))
        if plan is not None and signal.SIGTERM in early:
            code = 128 + signal.SIGTERM  # stopped while its image was pulled: never started
        else:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, **opts)
    except container.SetupFailed as e:  # its setup, in the image: the job's failure (or a stop)
        code = 128 + signal.SIGTERM if signal.SIGTERM in early else e.code
    except PullFailed as e:  # the image: the job's (not found) or maybe this node's
        if signal.SIGTERM in early:  # the group's SIGTERM stopped the pull too: not a failure
            code = 128 + signal.SIGTERM
        else:
            why = f"{start_errors.describe(start_errors.cause(e.kind))}: {e}"
            print(f"onepool: cannot start the rank: {why}", file=sys.stderr, flush=True)
            code, failed = start_errors.exit_code(e.kind), start_errors.record(e.kind, None, why)
    except (OSError, ValueError, subprocess.SubprocessError) as e:  # recorded with its cause
        kind = start_errors.classify(e, cmd[0])
        why = f"{start_errors.describe(start_errors.cause(kind))}: {cmd[0]!r}: {e}"
        print(f"onepool: cannot start the rank: {why}", file=sys.stderr, flush=True)
        code, failed = start_errors.exit_code(kind), start_errors.record(kind, e, why)
    if child is not None:
        started.append(True)
        for sig in dict.fromkeys(early):  # (one that came during Popen may reach it twice: harmless)
            if plan is not None and sig == signal.SIGUSR1:
                continue  # "checkpoint now" during the image's pull: nothing to save yet (and the
                # job inside, its handler not yet set, would die of it)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)
        copier = threading.Thread(target=copy_output, args=(child, out), daemon=True)
        copier.start()
        code, fenced = _wait(child, out)
    if code < 0:  # killed by a signal: report it the way a shell does
        code = 128 - code
    if plan is not None:
        if code == CONTAINER_FAILED and child is not None and failed is None:
            failed = start_errors.record("container_failed", None, start_errors.describe(
                start_errors.cause("container_failed")))
        container.remove(run_dir)  # (--rm did, unless the runtime was killed)
    if copier is not None:  # what the child printed last is in the log before its status
        copier.join(timeout=0.5)
    # at once: the status outlives us
    status: dict[str, object] = {"code": code}
    if fenced:
        status["cause"] = "fenced"
    if failed is not None:
        status["start_error"] = failed
    write_json(run_dir / "exit.json", status)
    end_leftovers(me)
    if copier is not None:  # leftovers that held the pipe are gone: the rest of their output
        copier.join(timeout=2.0)
    return code


def copy_output(child: subprocess.Popen[bytes], out: CappedOutput) -> None:
    """Copy the child's output (stdout and stderr, and its descendants' that inherited them)
    into the capped log until every writer has closed the pipe. Bytes a write cannot store
    (the disk is full) are dropped and counted as dropped (a gap before the next bytes that
    fit); the copy goes on, so the job never blocks on a full pipe."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    refused = 0
    while data := os.read(fd, 1 << 16):
        try:
            out.write_at(out.end + refused, data)
            refused = 0
        except OSError:
            refused += len(data)
    out.close()


def launch_options(run_dir: Path) -> dict[str, Any]:
    """How to start the job, from the launch file the broker wrote (read once, then deleted:
    it holds the job's environment): its whole environment (the supervisor's own is not
    passed on), its working directory, and the user it runs as. With a user, the child
    switches to it (groups, gid, uid) before exec, with umask 077, and gets SIGKILL if this
    supervisor dies (PR_SET_PDEATHSIG, set after the switch, which would clear it)."""
    path = run_dir / LAUNCH_FILE
    launch = json.loads(path.read_text())
    path.unlink()
    opts: dict[str, Any] = {"env": launch["env"], "cwd": launch["cwd"], "preexec_fn": _die_with_parent}
    if launch.get("container") is not None:  # run by the runtime's CLI as this user; see providers.container
        opts.update(container=launch["container"], env=launch["container"]["cli_env"])
    if launch.get("user") is not None:
        uid, gid, groups = launch["user"]
        opts.update(user=uid, group=gid, extra_groups=groups, umask=0o077)
    return opts


def _die_with_parent() -> None:
    """In the child, after the user switch: SIGKILL when this supervisor dies."""
    _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def join_cgroup(path: str | None) -> str | None:
    """Move this process into the cgroup at `path` (its children are born there). Returns
    the path, or None when there is none or it cannot be joined (the process group and the
    environment tag still contain the rank)."""
    if not path:
        return None
    try:
        Path(path, "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        print(f"onepool: cannot join cgroup {path} ({e}); contained by process group", file=sys.stderr)
        return None
    return path


def set_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init (Linux)."""
    # not Linux (no prctl): leftovers are still found by process group and environment tag
    with contextlib.suppress(AttributeError):
        _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def end_leftovers(me: psutil.Process, grace_s: float = 2.0) -> None:
    """SIGTERM every remaining descendant, SIGKILL those alive after `grace_s`, reap all."""
    for _ in range(10):  # a leftover may fork while it is being ended: look again
        procs = me.children(recursive=True)
        if not procs:
            return
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=grace_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The supervisor of one local rank: `python -m providers.local_runner RUN_DIR -- ARGV...`.

It is the leader of the rank's process group (the broker signals the whole group). It
records `handle.json` (pid, create time) as soon as it starts and `exit.json` (the child's
exit code) when the child ends, both by atomic rename, so a restarted broker can tell a
finished rank (exit.json) from a running one (live pid) from a lost one (neither). It
survives the broker: it runs in its own session.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (temp file, fsync, rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The child's exit status. Under a node agent (ONEPOOL_AGENT_LEASE names the lease file
    the agent touches after every sync with the server), a lease older than
    ONEPOOL_AGENT_FENCE_S stops the child (SIGTERM, ONEPOOL_GRACE_S, SIGKILL): the broker
    will soon count this node lost and run the work elsewhere, so it must not run here too."""
    lease = os.environ.get("ONEPOOL_AGENT_LEASE")
    if not lease:
        return child.wait()
    fence_s = float(os.environ.get("ONEPOOL_AGENT_FENCE_S", "20"))
    grace_s = float(os.environ.get("ONEPOOL_GRACE_S", "30"))
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        try:
            age = time.time() - os.stat(lease).st_mtime
        except FileNotFoundError:
            age = float("inf")
        if age > fence_s:
            print(f"onepool: no contact with the server for {age:.0f}s (fence {fence_s:g}s): "
                  "stopping this rank", file=sys.stderr, flush=True)
            child.send_signal(signal.SIGTERM)
            try:
                return child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m providers.local_runner RUN_DIR -- ARGV...", file=sys.stderr)
        return 2
    run_dir, cmd = Path(argv[0]), argv[2:]
    me = psutil.Process()
    write_json(run_dir / "handle.json", {"pid": me.pid, "create_time": me.create_time()})
    # The group gets SIGTERM and SIGUSR1 ("checkpoint now"); the child handles them. This
    # supervisor only waits (a Python handler, unlike SIG_IGN, is reset to the default in
    # the child at exec).
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        child = subprocess.Popen(cmd)
        code = _wait(child)
    except FileNotFoundError:
        print(f"onepool: command not found: {cmd[0]}", file=sys.stderr)
        code = 127
    except PermissionError:
        print(f"onepool: permission denied: {cmd[0]}", file=sys.stderr)
        code = 126
    if code < 0:  # killed by a signal: report it the way a shell does
        code = 128 - code
    write_json(run_dir / "exit.json", {"code": code})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python witness.py LOCK_DIR VIOLATIONS -- ARGV...`: run ARGV holding an exclusive lock
on LOCK_DIR/job-<ONEPOOL_JOB_ID>-rank-<ONEPOOL_RANK>.lock for its whole life.

The kernel drops the lock when the process dies, however it dies. If the lock is already
held, a process of another attempt of the same job and rank is alive at this moment: that
is a concurrent duplicate, and one JSON line is appended to VIOLATIONS (the job still runs,
so the suite sees everything that follows). A stand-alone script: imports nothing of onepool.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    lock_dir, violations, sep, cmd = argv[0], argv[1], argv[2], argv[3:]
    assert sep == "--" and cmd, "usage: witness.py LOCK_DIR VIOLATIONS -- ARGV..."
    job, rank = os.environ.get("ONEPOOL_JOB_ID", "?"), os.environ.get("ONEPOOL_RANK", "0")
    fd = os.open(os.path.join(lock_dir, f"job-{job}-rank-{rank}.lock"), os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(violations, "a") as f:
            f.write(json.dumps({"job": job, "rank": rank, "attempt": os.environ.get("ONEPOOL_ATTEMPT"),
                                "pid": os.getpid(), "time": time.time()}) + "\n")
    os.set_inheritable(fd, True)  # held by the job itself after exec
    os.execv(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A job's `setup` commands (issue 26), once per node per (image, code, setup) digest, then the
job's own command: `python -I setup_runner.py MARKERS DIGEST -- ARGV...`, with the commands as
a JSON list in $ONEPOOL_SETUP (removed from the job's environment).

It runs as the rank's user, in the rank's folder (its code copy), inside the rank's
supervisor, so its output goes to the job's log and a stop or preemption reaches it like the
job. Under an exclusive lock on `MARKERS/DIGEST.lock` (ranks of one node wait for the first):
if `MARKERS/DIGEST.done` exists, nothing runs ("cached"); else each command runs with `bash -c`
in order, and the marker is written only when all succeeded. A failing command ends the rank
with its exit status (the job's failure: a retry on the same node runs setup again). How long
setup took, and whether it was cached, is printed and written to `$ONEPOOL_JOB_DIR/setup.json`.
Then the job's command replaces this process (exec). Standard library only: it runs with
`python -I`, before anything of the job.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

SETUP_ENV = "ONEPOOL_SETUP"


def main(args: list[str]) -> int:
    markers, digest, sep, *argv = args
    if sep != "--" or not argv:
        print("onepool setup: usage: setup_runner.py MARKERS DIGEST -- ARGV...", file=sys.stderr)
        return 2
    commands = json.loads(os.environ.pop(SETUP_ENV, "[]"))
    os.makedirs(markers, mode=0o700, exist_ok=True)
    t0 = time.monotonic()
    done = os.path.join(markers, f"{digest}.done")
    with open(os.path.join(markers, f"{digest}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = os.path.exists(done)
        if cached:
            print(f"onepool setup: cached on this node ({digest[:12]})", flush=True)
        else:
            for cmd in commands:
                print(f"onepool setup: $ {cmd}", flush=True)
                code = subprocess.run(["bash", "-c", cmd]).returncode
                if code != 0:
                    print(f"onepool setup: failed (exit {code}): {cmd}", flush=True)
                    return code if 0 < code < 256 else 1
            with open(done, "w") as f:
                f.write(json.dumps({"commands": commands}))
    took = time.monotonic() - t0
    print(f"onepool setup: {'cached' if cached else 'done'} in {took:.2f} s", flush=True)
    job_dir = os.environ.get("ONEPOOL_JOB_DIR")
    if job_dir:
        try:
            with open(os.path.join(job_dir, "setup.json"), "w") as f:
                json.dump({"setup_s": round(took, 3), "cached": cached, "digest": digest}, f)
        except OSError as e:
            print(f"onepool setup: cannot record its time: {e}", flush=True)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"onepool setup: cannot start {argv[0]!r}: {e}", flush=True)
        return 127 if isinstance(e, FileNotFoundError) else 126
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

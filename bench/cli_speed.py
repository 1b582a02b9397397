"""How fast the CLI answers, as a person runs it: whole processes, start to exit.

    .venv/bin/python bench/cli_speed.py                  # this tree -> bench/results/cli_speed.json
    .venv/bin/python bench/cli_speed.py --tree DIR --label before   # another checkout, same venv

Each command runs `--runs` times (after one discarded warm-up run) as
`python -c <run the console script's main>` against a broker home seeded with `--jobs` jobs (a
mix of finished, preempted, running and pending ones with their attempts), built by the tree
under test itself so its schema matches. Reported: median, min and 90th percentile wall
seconds, and the median CPU seconds (user + system) the process used, which a busy shared
machine does not inflate.

Assumptions (all favour neither side; both trees run with the same interpreter and packages):
- warm OS file cache and compiled .pyc files (the warm-up run is discarded);
- a SQLite home on local disk, and no broker running;
- this repository's editable install: its import hook costs ~15 ms that a regular install
  does not pay;
- the machine is shared: its load average is recorded with the result; medians, not means.
The goal (issue 13) is `onepool status` under 0.3 s.

    .venv/bin/python bench/cli_speed.py --http --jobs 10000 --runs 5   # -> cli_speed_http.json

`--http` (issue 27) times the commands over HTTP instead: a `onepool server --no-broker` on
127.0.0.1 serves the seeded home and each command runs with ONEPOOL_URL and a token, as on a
laptop; `onepool submit` is timed too. Goals: submit <= 0.15 s, status <= 0.2 s at 10,000 jobs,
each beside `python -c pass` on the same machine. The server runs no broker, so every command
also prints the "no broker has run" warning (one more request, as a user would pay it). Run
the tree before a change with `--tree DIR --label NAME` in the same session to compare (e.g.
`git archive COMMIT | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
COMMANDS: dict[str, list[str]] = {
    "python (interpreter only)": [],
    "onepool --help": ["--help"],
    "onepool status": ["status"],
    "onepool status --json": ["status", "--json"],
    "onepool status JOB": ["status", "1"],
    "onepool status --state running": ["status", "--state", "running"],
    "onepool pools": ["pools"],  # not in trees before issue 13: reported as unavailable there
    "onepool cost --by pool": ["cost", "--by", "pool"],
}
HTTP_COMMANDS: dict[str, list[str]] = {
    "python (interpreter only)": [],
    "onepool submit": ["submit", "--name", "probe", "--team", "vision", "--", "true"],
    "onepool status": ["status"],
    "onepool status --json": ["status", "--json"],
    "onepool status JOB": ["status", "1"],
}
RUN = ("import sys; sys.path.insert(0, {tree!r}); sys.argv = ['onepool'] + {args!r}\n"
       "from broker.client.cli import main\n"
       "try:\n    main()\nexcept SystemExit as e:\n    sys.exit(e.code)\n")
SEED = """
import sys; sys.path.insert(0, {tree!r})
from broker.client.sdk import Client
from broker.spec import parse_config
from broker.state.model import Attempt, Job
c = Client({home!r})
c.apply(parse_config({{
    "pools": [{{"name": "a100", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 4,
               "price_per_node_hour": 16}},
              {{"name": "l4", "gpu_type": "L4", "gpus_per_node": 4, "nodes": 2}}],
    "teams": [{{"name": "vision"}}, {{"name": "nlp"}}]}}))
t0 = 1_790_000_000.0
with c.store.session() as s:
    for i in range({jobs}):
        state = ["SUCCEEDED", "SUCCEEDED", "FAILED", "RUNNING", "PENDING"][i % 5]
        j = Job(name=f"job-{{i}}", team=["vision", "nlp"][i % 2], experiment=f"exp-{{i % 7}}",
                command=["python", "train.py"], gpus_per_node=1 + i % 4, priority="normal",
                state=state, submit_time=t0 + i, queued_at=t0 + i, attempts=1 + (i % 3 == 0))
        s.add(j)
        s.flush()
        for n in range(j.attempts):
            last = n == j.attempts - 1
            s.add(Attempt(job_id=j.id, number=n + 1, pool="a100", alloc=[["a100-0", [0]]],
                          priority="normal", started_at=t0 + i + 100 * n,
                          ended_at=None if last and state == "RUNNING" else t0 + i + 100 * n + 90,
                          state="RUNNING" if last and state == "RUNNING" else "ENDED",
                          end_reason=None if last else "PREEMPTED", gpus=1,
                          lost_gpu_s=0.0 if last else 30.0))
        if state == "PENDING":
            j.attempts = 0
"""


def seed(python: str, tree: Path, home: Path, jobs: int) -> None:
    subprocess.run([python, "-c", SEED.format(tree=str(tree), home=str(home), jobs=jobs)], check=True,
                   env={**os.environ, "ONEPOOL_HOME": str(home)})


@contextlib.contextmanager
def serve(python: str, tree: Path, home: Path) -> Iterator[dict[str, str]]:
    """`onepool server --no-broker` on the home, on a free port of 127.0.0.1, and an admin
    token: the environment of a command run over HTTP."""
    env = {**os.environ, "ONEPOOL_HOME": str(home), "PYTHONPATH": str(tree)}
    env.pop("ONEPOOL_DATABASE_URL", None)
    made = subprocess.run([python, "-m", "broker.client.cli", "token", "create", "--team", "vision", "--role",
                           "admin", "--json"], env=env, cwd=tree, capture_output=True, text=True, check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([python, "-m", "broker.client.cli", "server", "--no-broker", "--port", str(port)],
                         env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/v1/healthz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise SystemExit("the server did not come up") from None
                time.sleep(0.1)
        yield {"ONEPOOL_URL": url, "ONEPOOL_TOKEN": json.loads(made.stdout)["token"]}
    finally:
        p.terminate()
        p.wait(timeout=30)


def time_command(python: str, tree: Path, home: Path, args: list[str],
                 runs: int, remote: dict[str, str] | None = None) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of each run. CPU time (user + system, from wait4) is what the
    process itself needed; on a busy shared machine wall time also holds waiting for a core.
    `remote`: ONEPOOL_URL and ONEPOOL_TOKEN (the command runs over HTTP)."""
    code = RUN.format(tree=str(tree), args=args) if args else "pass"
    env = {**os.environ, "ONEPOOL_HOME": str(home), **(remote or {})}
    env.pop("ONEPOOL_DATABASE_URL", None)
    wall, cpu = [], []
    for i in range(runs + 1):
        t = time.perf_counter()
        p = subprocess.Popen([python, "-c", code], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        if p.stderr:
            p.stderr.close()
        if p.returncode != 0 and "No such command" in err:
            raise LookupError(args[0])
        if p.returncode != 0:
            raise SystemExit(f"onepool {' '.join(args)} failed ({p.returncode}): {err[-2000:]}")
        if i:  # the first run warms caches and writes .pyc files
            wall.append(dt)
            cpu.append(usage.ru_utime + usage.ru_stime)
    return wall, cpu


def summary(results: dict[str, dict[str, float] | None], http: bool) -> dict[str, float | bool | None]:
    """The headline figures (medians, seconds) and, over HTTP, whether each meets its goal."""
    def median(name: str, key: str = "median_s") -> float | None:
        r = results.get(name)
        return None if r is None else r[key]

    out: dict[str, float | bool | None] = {"python_median_s": median("python (interpreter only)"),
                                           "status_median_s": median("onepool status"),
                                           "status_cpu_median_s": median("onepool status", "cpu_median_s")}
    if http:
        out.update(submit_median_s=median("onepool submit"),
                   submit_cpu_median_s=median("onepool submit", "cpu_median_s"))
        out["submit_goal_met"] = (out["submit_median_s"] or 1e9) <= 0.15  # type: ignore[operator]
        out["status_goal_met"] = (out["status_median_s"] or 1e9) <= 0.2  # type: ignore[operator]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="source tree to time (default: this one)")
    ap.add_argument("--label", default="", help="suffix of the result file, e.g. before")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--http", action="store_true", help="over HTTP, against a server on 127.0.0.1")
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    python = sys.executable
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        home = Path(d) / "home"
        seed(python, args.tree.resolve(), home, args.jobs)
        remote = stack.enter_context(serve(python, args.tree.resolve(), home)) if args.http else None
        results = {}
        print(f"{'':<34} {'wall median':>12} {'wall min':>9} {'wall p90':>9} {'CPU median':>11}")
        for name, cmd in (HTTP_COMMANDS if args.http else COMMANDS).items():
            try:
                wall, cpu = time_command(python, args.tree.resolve(), home, cmd, args.runs, remote)
            except LookupError:
                results[name] = None
                print(f"{name:<34} (no such command in this tree)")
                continue
            t = sorted(wall)
            results[name] = {"median_s": round(statistics.median(t), 4), "min_s": round(t[0], 4),
                             "p90_s": round(t[int(0.9 * (len(t) - 1))], 4),
                             "cpu_median_s": round(statistics.median(cpu), 4)}
            r = results[name]
            print(f"{name:<34} {r['median_s']:>10.3f} s {r['min_s']:>7.3f} s {r['p90_s']:>7.3f} s "
                  f"{r['cpu_median_s']:>9.3f} s", flush=True)
    tree = args.tree.resolve()
    out = {"tree": "this checkout" if tree == ROOT else f"another checkout ({tree.name})",
           "runs": args.runs, "jobs_in_home": args.jobs,
           "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "load_average_1m_at_start": round(load_at_start, 2),
           "load_average_1m_at_end": round(os.getloadavg()[0], 2),
           "summary": summary(results, args.http),
           "goal": ("over HTTP: submit <= 0.15 s, status <= 0.2 s at 10,000 jobs" if args.http
                    else "onepool status < 0.3 s"), "over_http": args.http,
           "commands": results,
           "assumptions": ["warm file cache and .pyc (one warm-up run discarded)",
                           "SQLite home on local disk, no broker running",
                           "editable install (its import hook adds ~15 ms per process)",
                           "shared 2-core machine: see load_average_1m_at_start and _at_end"]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "cli_speed" + ("_http" if args.http else "") + (f"_{args.label}" if args.label else "")
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()

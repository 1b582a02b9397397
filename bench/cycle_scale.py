"""A live cycle's wall time at 10,000 and 100,000 pending jobs with nothing changed (issue 27:
<= 50 ms and <= 300 ms on 2 cores), beside plan() alone on the same snapshot, and beside the
cycle before issue 27 (every pending job read as a full ORM object for the snapshot, again
for the holds and for "why waiting": broker.control.snapshots.build_snapshot and the old
reasons loop), run in the same process on the same database.

Set-up: one broker home on SQLite (WAL) in a temporary folder; one local pool of 2 nodes x 8
GPUs held by 2 high-priority jobs that run `sleep` as real processes (the engine polls them
every cycle); the pending jobs are written in bulk (1, 2 or 4 GPUs, normal or low, two
teams, half with a runtime estimate), so they cannot start and nothing preempts: every cycle
plans the whole queue, with reasons, and finds nothing new. The clock advances 2 s (the
default cycle interval) between cycles. The first cycle of an engine (a new leader's full
read) is reported apart (`first_cycle_ms`). Each figure is a median, as wall time and as this
process's CPU time (on a loaded machine the wall time also counts the time others had the
core; the load average before and after is in the JSON: rerun when it was high).

Assumptions favouring onepool (also in the JSON): SQLite on a local disk (PostgreSQL adds a
round trip per query); nothing changes between the measured cycles (each changed job costs
a row read and, for a pending one, a queue update); 2 running jobs (a cycle's poll and
checkpoint listing grow with the running attempts, not with the queue); no agents, no rented
pools, no budgets.

    .venv/bin/python bench/cycle_scale.py [--runs 7] [--quick]  -> bench/results/cycle_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert  # noqa: E402
from sqlmodel import Session, select  # noqa: E402

from broker.client.sdk import Client  # noqa: E402
from broker.clock import FakeClock  # noqa: E402
from broker.control.engine import Engine  # noqa: E402
from broker.control.snapshots import FairShareUsage, build_snapshot  # noqa: E402
from broker.policy import PolicyConfig, Snapshot, plan  # noqa: E402
from broker.spec import parse_config  # noqa: E402
from broker.state.model import Job, JobState  # noqa: E402
from providers.local import LocalProcesses  # noqa: E402

CYCLE_S = 2.0


class FullRead:
    """The cycle's reads and writes before issue 27, in KeptState's shape: every cycle reads
    every pending job as an ORM object (the snapshot), its holds' columns (twice), and every
    pending job again to compare its waiting reason."""

    fencing = None

    def reset(self) -> None:
        pass

    def refresh(self, s: Session, fencing: int | None = None) -> None:
        pass

    def waiting(self) -> None:
        return None  # broker.control.holds reads them itself

    def snapshot(self, s: Session, now: float, config: PolicyConfig, half_life_s: float,
                 usage: FairShareUsage | None) -> Snapshot:
        return build_snapshot(s, now, config, half_life_s, usage)

    def sync_queue(self, snap: Snapshot) -> Snapshot:
        return snap

    def write_reasons(self, s: Session, waiting: Mapping[int, str]) -> int:
        n = 0
        for j in s.exec(select(Job).where(Job.state == JobState.PENDING)).all():
            if j.waiting_reason != waiting.get(j.id or 0):
                j.waiting_reason = waiting.get(j.id or 0)
                s.add(j)
                n += 1
        return n


def build(home: Path, pending: int, seed: int = 1) -> tuple[Client, FakeClock, LocalProcesses]:
    clock = FakeClock()
    c = Client(home, clock=clock)
    c.apply(parse_config({
        "pools": [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 2}],
        "teams": [{"name": "research", "priority_allowance_gpus": 64},
                  {"name": "prod", "priority_allowance_gpus": 64}],
        "broker": {"cycle_s": CYCLE_S, "grace_s": 30, "min_run_s": 0}}))
    runs = LocalProcesses(home / "runs", containment="group")
    for team in ("research", "prod"):
        c.submit(name="holder", team=team, command=["sleep", "3600"], gpus_per_node=8, priority="high")
    eng = Engine(c.store, clock, runs)
    started = eng.cycle().started
    assert len(started) == 2, started
    eng.close()
    rng = random.Random(seed)
    base = Job(name="w", team="research", command=["python", "train.py"], submit_time=0.0,
               queued_at=0.0).model_dump(exclude={"id", "change_seq"})
    now = clock.now()
    rows = [dict(base, team=rng.choice(("research", "prod")), gpus_per_node=rng.choice((1, 1, 2, 4)),
                 priority=rng.choice(("normal", "low")), submit_time=now - rng.uniform(0, 3600),
                 queued_at=now, experiment=f"e{rng.randrange(20)}",
                 expected_duration_s=rng.choice((None, rng.uniform(600, 30000))))
            for _ in range(pending)]
    with c.store.session() as s:
        for i in range(0, len(rows), 10_000):
            s.execute(insert(Job), rows[i:i + 10_000])
    return c, clock, runs


def cycles(eng: Engine, clock: FakeClock, runs: int) -> tuple[float, list[float], list[float]]:
    """(the first cycle's ms, the next `runs` cycles' wall ms, and their CPU ms in this
    process); nothing may start or stop."""
    out, cpu = [], []
    for i in range(runs + 1):
        clock.advance(CYCLE_S)
        c0, t0 = time.process_time(), time.perf_counter()
        rep = eng.cycle()
        out.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        if i and (rep.started or rep.preempted or rep.ended):
            raise SystemExit(f"a measured cycle changed something: {rep}")
    return out[0], out[1:], cpu[1:]


def plan_alone(eng: Engine, clock: FakeClock, runs: int) -> tuple[list[float], list[float]]:
    """plan() with reasons on the snapshot the engine's cycle plans on: (wall ms, CPU ms)."""
    with eng.store.session() as s:
        snap = eng.snapshot(s, clock.now())
    out, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        plan(snap)
        out.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return out, cpu


def measure(pending: int, runs: int, baseline_runs: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="onepool-cycle-"))
    try:
        t0 = time.perf_counter()
        c, clock, procs = build(home, pending)
        setup_s = time.perf_counter() - t0
        eng = Engine(c.store, clock, procs)
        try:
            first, kept, kept_cpu = cycles(eng, clock, runs)
            alone, alone_cpu = plan_alone(eng, clock, runs)
            eng.kept = FullRead()  # type: ignore[assignment]
            _, old, old_cpu = cycles(eng, clock, baseline_runs)
            alone_old, _ = plan_alone(eng, clock, runs)
        finally:
            eng.close()
            procs.kill_all()
        med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
        row = {"pending": pending, "running": 2, "nodes": 2, "runs": runs, "baseline_runs": baseline_runs,
               "cycle_ms_median": med(kept), "cycle_ms_max": round(max(kept), 2),
               "cycle_cpu_ms_median": med(kept_cpu), "plan_cpu_ms_median": med(alone_cpu),
               "baseline_cycle_cpu_ms_median": med(old_cpu),
               "first_cycle_ms": round(first, 2), "plan_ms_median": med(alone),
               "plan_ms_median_without_kept_queue": med(alone_old),
               "baseline_cycle_ms_median": med(old), "speedup": round(med(old) / med(kept), 1),
               "setup_s": round(setup_s, 1)}
        print(f"pending {pending:>7,}: cycle {row['cycle_ms_median']:8.2f} ms "
              f"(CPU {row['cycle_cpu_ms_median']:.2f}) "
              f"(max {row['cycle_ms_max']:.2f}, "
              f"first {first:.0f}); plan() alone {row['plan_ms_median']:.2f} ms "
              f"({row['plan_ms_median_without_kept_queue']:.2f} without the kept queue); "
              f"before issue 27 {row['baseline_cycle_ms_median']:.1f} ms ({row['speedup']}x)", flush=True)
        return row
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="measured cycles per size (>= 5)")
    ap.add_argument("--quick", action="store_true", help="5 runs, 1 of the slow baseline at 100k")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cycle_scale.json")
    a = ap.parse_args()
    runs = 5 if a.quick else max(5, a.runs)
    load_before = os.getloadavg()
    rows = [measure(10_000, runs, runs), measure(100_000, runs, 1 if a.quick else 5)]
    load_after = os.getloadavg()
    by = {r["pending"]: r for r in rows}
    out = {
        "python": sys.version.split()[0], "cores": os.cpu_count(), "quick": a.quick,
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
        "summary": {"cycle_ms_10000": by[10_000]["cycle_ms_median"],
                    "cycle_ms_100000": by[100_000]["cycle_ms_median"],
                    "plan_ms_10000": by[10_000]["plan_ms_median"],
                    "plan_ms_100000": by[100_000]["plan_ms_median"],
                    "cycle_cpu_ms_10000": by[10_000]["cycle_cpu_ms_median"],
                    "cycle_cpu_ms_100000": by[100_000]["cycle_cpu_ms_median"],
                    "baseline_cycle_ms_10000": by[10_000]["baseline_cycle_ms_median"],
                    "baseline_cycle_ms_100000": by[100_000]["baseline_cycle_ms_median"],
                    "goal": "cycle_ms_10000 <= 50 and cycle_ms_100000 <= 300 (medians, 2 cores)"},
        "results": rows,
        "setup": {"database": "sqlite (WAL), local disk", "pool": "1 local pool, 2 nodes x 8 GPUs",
                  "running": "2 high-priority 8-GPU jobs (real `sleep` processes)",
                  "pending": "1/2/4 GPUs, normal or low, 2 teams, half with runtime estimates",
                  "cycle_interval_s": CYCLE_S},
        "assumptions_favouring_onepool": [
            "SQLite on a local disk (PostgreSQL adds a network round trip per query)",
            "nothing changes between measured cycles (each change costs a row read and a queue update)",
            "2 running attempts: poll and checkpoint listing grow with running work, not the queue",
            "no agents, rented pools, budgets, dependencies or arrays"],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, on "
          f"{os.cpu_count()} cores; wrote {a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out}")


if __name__ == "__main__":
    main()

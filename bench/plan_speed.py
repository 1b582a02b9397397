"""Time broker.policy.plan() on synthetic snapshots: 1k and 10k pending jobs over 100 and
1,000 8-GPU nodes (two GPU types), the nodes ~95% busy with a mix of classes, so every
cycle has placements, blocked jobs, reservations and preemption searches. Running jobs and
half the pending ones carry runtime estimates, so EASY reservations have starts to compute.

Three timings per size: without "why waiting" reasons (what the simulator asks for); with
them, as the live engine asks since issue 27 (`median_ms_with_reasons`: the engine keeps the
pending queue and the running attempts' reclaim index across cycles, broker.control.kept, and
hands them to plan(), which then does not rebuild them); and with them on a bare snapshot
(`median_ms_with_reasons_cold`: plan() builds both, as the engine's first cycle does). Each
is the median of --repeat runs, the garbage collector on, as in production, as wall time and
as this process's CPU time (on a shared, loaded machine the wall time also counts the time
others had the core). The load average at the start and the end is written with the results;
rerun when it was high.

    .venv/bin/python bench/plan_speed.py [--repeat 30]   -> bench/results/plan_speed.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import compiled  # bench/compiled.py: --compiled

sys.path.insert(0, compiled.import_root(sys.argv))

from broker.policy import (
    NodeView,
    PendingView,
    Plan,
    PoolView,
    RunningView,
    Snapshot,
    TeamView,
    plan,
)
from broker.policy.queue import PendingQueue
from broker.policy.reclaim_index import ReclaimIndex
from broker.spec import Priority

CLASSES = [Priority.URGENT, Priority.HIGH, Priority.NORMAL, Priority.LOW]
WEIGHTS = [0.02, 0.08, 0.45, 0.45]
SHAPES = [(1, 1)] * 8 + [(2, 1), (4, 1), (8, 1), (8, 1), (8, 2), (8, 4)]


def snapshot(n_pending: int, n_nodes: int, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    half = n_nodes // 2
    pools = (
        PoolView("a100", "A100", 8, tuple(NodeView(f"a100-{i}", 8) for i in range(half))),
        PoolView("v100", "V100", 8, tuple(NodeView(f"v100-{i}", 8) for i in range(n_nodes - half))),
    )
    teams = tuple(TeamView(f"t{i}", 1.0 + i % 3, 64, rng.uniform(0, 1e6)) for i in range(10))
    running = []
    aid = 1
    for p in pools:
        for node in p.nodes:
            free = 8
            while free > 0 and rng.random() < 0.95:
                g = min(free, rng.choice([1, 1, 2, 4, 8]))
                running.append(RunningView(
                    aid, 100_000 + aid, f"t{rng.randrange(10)}", rng.choices(CLASSES, WEIGHTS)[0],
                    ((node.id, g),), started_at=rng.uniform(0, 5000), submit_time=0,
                    last_checkpoint_at=rng.uniform(0, 5000),
                    expected_end=rng.choice([None, rng.uniform(6000, 40000)])))
                aid += 1
                free -= g
    pending = []
    for j in range(n_pending):
        g, n = rng.choice(SHAPES)
        pending.append(PendingView(j + 1, f"t{rng.randrange(10)}", rng.choices(CLASSES, WEIGHTS)[0],
                                   g, rng.uniform(0, 6000), n,
                                   ("A100",) if rng.random() < 0.2 else (),
                                   expected_duration_s=rng.choice([None, rng.uniform(600, 30000)])))
    return Snapshot(now=6000.0, pools=pools, running=tuple(running), pending=tuple(pending),
                    teams=teams)


def kept(snap: Snapshot) -> Snapshot:
    """The snapshot as the live engine hands it to plan(): with the pending queue and the
    reclaim index it keeps across cycles (broker.control.kept)."""
    cfg = snap.config
    return dataclasses.replace(snap, queue=PendingQueue(snap.pending), reclaim_index=ReclaimIndex(
        snap.running, cfg.promote_after_s if cfg.classes else None, cfg.promote_gangs_only))


def _median_ms(snap: Snapshot, explain: bool, repeat: int) -> tuple[float, float, float, Plan]:
    """(median wall ms, p99 wall ms, median CPU ms of this process, the plan)."""
    plan(snap, explain=explain)  # warm-up
    walls, cpus = [], []
    p = None
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        p = plan(snap, explain=explain)
        walls.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    walls.sort()
    assert p is not None
    return (round(statistics.median(walls), 2),
            round(walls[min(len(walls) - 1, int(0.99 * len(walls)))], 2),
            round(statistics.median(cpus), 2), p)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", default=None,
                    help="default: results/plan_speed.json, or plan_speed_compiled.json")
    ap.add_argument("--compiled", action="store_true",
                    help="plan() from a mypyc-compiled copy of broker/policy (bench/compiled.py)")
    args = ap.parse_args()
    args.out = args.out or str(Path(__file__).parent / "results" / (
        "plan_speed_compiled.json" if compiled.label() else "plan_speed.json"))
    load_before = os.getloadavg()
    rows = []
    for pending in (1_000, 10_000):
        for nodes in (100, 1_000):
            snap = snapshot(pending, nodes)
            med, p99, cpu, p = _median_ms(snap, False, args.repeat)
            med_c, p99_c, cpu_c, p_cold = _median_ms(snap, True, args.repeat)
            med_x, p99_x, cpu_x, p_kept = _median_ms(kept(snap), True, args.repeat)
            assert p_kept == p_cold, "the kept indexes changed the plan"
            row = {"pending": pending, "nodes": nodes, "running": len(snap.running),
                   "median_ms": med, "p99_ms": p99, "median_cpu_ms": cpu,
                   "median_ms_with_reasons": med_x, "p99_ms_with_reasons": p99_x,
                   "median_cpu_ms_with_reasons": cpu_x,
                   "median_ms_with_reasons_cold": med_c, "p99_ms_with_reasons_cold": p99_c,
                   "median_cpu_ms_with_reasons_cold": cpu_c,
                   "placements": len(p.placements), "preemptions": len(p.preemptions),
                   "reservations": len(p.reservations), "repeat": args.repeat}
            rows.append(row)
            print(f"pending {pending:>6,} nodes {nodes:>5,} running {row['running']:>5,}: "
                  f"median {med:7.2f} ms (p99 {p99:7.2f}, CPU {cpu:7.2f}); with reasons "
                  f"{med_x:7.2f} ms (CPU {cpu_x:7.2f}; cold {med_c:7.2f}, CPU {cpu_c:7.2f}) "
                  f"({row['placements']} placed, {row['preemptions']} preempted)")
    load_after = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "python": sys.version.split()[0], "compiled": compiled.label(), "cores": os.cpu_count(),
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
        "results": rows}, indent=2) + "\n")
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, "
          f"on {os.cpu_count()} cores; wrote {args.out}")


if __name__ == "__main__":
    main()

"""Time onepool over the real test Slurm (tests/slurm/start_slurm.sh): submit to running,
preempt to requeued, and resume, for onepool's own preemption and for Slurm's.

    .venv/bin/python bench/slurm_timings.py [--repeat 3]   -> bench/results/slurm_timings.json

Assumptions (they favour neither side, but say what the numbers are about):
- one node, four fake A100s, partition `onepool` (GraceTime=0) under `urgent`; slurmctld with
  SchedulerParameters=bf_interval=1,sched_interval=2 and AuthInfo=cred_expire=5 (a requeued
  job's GPUs are reusable after 5 s; Slurm's default 120 s would dominate resume times);
- the broker cycles every 0.1 s on the system clock (production default: 2 s, plus up to
  one cycle on each step below); jobs are examples/train_numpy.py (0.05 s steps, a
  checkpoint every 5 steps and on SIGTERM, to the broker home's folder);
- "running" is the first broker cycle that sees the Slurm job RUNNING (squeue); "first
  step" is when the broker first sees the job's progress marker; "requeued" is when the
  victim is PENDING in onepool again; "resumed" is the resumed attempt's first new step, so
  requeued-to-resumed includes the preemptor's own run (the urgent job's 20 steps, the
  other user's `sleep 1`) and the requeued job's start; restart overhead is the resumed
  attempt's start to its first new step (Python start, restore, first step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.client.sdk import Client  # noqa: E402
from broker.clock import SystemClock  # noqa: E402
from broker.control.engine import Engine  # noqa: E402
from broker.spec import parse_config  # noqa: E402
from tests.conftest import config, train  # noqa: E402
from tests.slurm.conftest import POOL, START, scancel_all, slurm_pool  # noqa: E402

CYCLE_S = 0.1


def until(eng: Engine, cond: Callable[[], bool], timeout: float = 120.0) -> float:
    """Cycle until cond() holds; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while True:
        eng.cycle()
        if cond():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        eng.executor.wait_for_change(CYCLE_S)  # type: ignore[attr-defined]


def slurm_state(eng: Engine, c: Client, job: int, number: int) -> str | None:
    a = next((x for x in c.get(job).attempt_list if x.number == number), None)
    if a is None:
        return None
    from sqlmodel import select

    from broker.state.model import Attempt

    with c.store.session() as s:
        row = s.exec(select(Attempt).where(Attempt.id == a.id)).one()
        jid = row.handles[0].get("job_id") if row.handles else None
    j = eng.slurm.jobs(POOL).get(str(jid)) if jid and eng.slurm else None  # type: ignore[union-attr]
    return j.state if j else None


def first_step(c: Client, job: int, number: int) -> float | None:
    """When the broker first saw attempt `number` make progress (its clock), or None."""
    a = next((x for x in c.get(job).attempt_list if x.number == number), None)
    if a is None or a.restart_overhead_s is None:
        return None
    return a.started_at + a.restart_overhead_s


def one_round(home: Path) -> dict[str, float]:
    clock = SystemClock()
    c = Client(home, clock=clock)
    c.apply(parse_config(config(pools=[slurm_pool()], cycle_s=CYCLE_S)))
    eng = Engine(c.store, clock)
    out: dict[str, float] = {}
    try:
        # 1. submit to running, on an idle partition
        t0, w0 = time.monotonic(), clock.now()
        j = c.submit(name="low", team="research", command=train(1000, ckpt_every=5), gpus_per_node=4,
                     priority="low").id
        out["submit_to_slurm_running_s"] = until(eng, lambda: slurm_state(eng, c, j, 1) == "RUNNING") - t0
        until(eng, lambda: first_step(c, j, 1) is not None and (c.get(j).last_step or -1) >= 5)
        out["submit_to_first_step_s"] = (first_step(c, j, 1) or 0.0) - w0
        # 2. onepool preempts it for an urgent job
        t0 = time.monotonic()
        u = c.submit(name="urgent", team="prod", command=train(20), gpus_per_node=2, priority="urgent").id
        out["onepool_preempt_to_requeued_s"] = until(eng, lambda: c.get(j).status == "PENDING") - t0
        out["onepool_preempt_to_urgent_running_s"] = until(
            eng, lambda: slurm_state(eng, c, u, 1) == "RUNNING") - t0
        t_req = clock.now()
        until(eng, lambda: first_step(c, j, 2) is not None)
        out["requeued_to_resumed_after_urgent_s"] = (first_step(c, j, 2) or 0.0) - t_req
        out["resume_restart_overhead_s"] = c.get(j).attempt_list[1].restart_overhead_s or 0.0
        until(eng, lambda: (c.get(j).last_step or -1) >= (c.get(j).attempt_list[1].restored_step or 0) + 5)
        # 3. Slurm preempts it for another user's job in a higher partition
        t0 = time.monotonic()
        subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--gres=gpu:a100:4", "-J", "not-onepool",
                        "-o", "/dev/null", "--wrap", "sleep 1"], check=True, capture_output=True)
        out["slurm_preempt_to_requeued_s"] = until(eng, lambda: c.get(j).status == "PENDING") - t0
        t_req = clock.now()
        until(eng, lambda: first_step(c, j, 3) is not None)
        out["requeued_to_resumed_after_slurm_job_s"] = (first_step(c, j, 3) or 0.0) - t_req
        out["slurm_resume_restart_overhead_s"] = c.get(j).attempt_list[2].restart_overhead_s or 0.0
        c.cancel(j)
        until(eng, lambda: c.get(j).status == "CANCELLED")
    finally:
        from broker.control.capacity_manager import broker_id

        with c.store.session() as s:
            scancel_all(f"onepool-{broker_id(s)}-")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "slurm_timings.json"))
    args = ap.parse_args()
    subprocess.run([str(START)], check=True)
    rounds = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            rounds.append(one_round(Path(d) / "home"))
        print(f"round {i + 1}: " + ", ".join(f"{k}={v:.2f}" for k, v in rounds[-1].items()), flush=True)
    summary = {k: {"median": statistics.median(r[k] for r in rounds), "min": min(r[k] for r in rounds),
                   "max": max(r[k] for r in rounds)} for k in rounds[0]}
    print(f"\n{'step':44} {'median s':>9} {'min':>7} {'max':>7}")
    for k, v in summary.items():
        print(f"{k:44} {v['median']:9.2f} {v['min']:7.2f} {v['max']:7.2f}")
    Path(args.out).write_text(json.dumps({"repeat": args.repeat, "cycle_s": CYCLE_S, "rounds": rounds,
                                          "summary": summary, "assumptions": __doc__}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

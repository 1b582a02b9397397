"""Run several policies over one trace and scenario; the result is one JSON-able dict.

Policies run in parallel worker processes (one per core); each reports its progress.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from broker.sim.policies import NAMES, SimPolicy, resolve
from broker.sim.scenario import Scenario, load_scenario
from broker.sim.simulator import Simulator
from broker.sim.trace import TraceJob, read_trace


def scenario_summary(sc: Scenario, trace: list[TraceJob], path: str) -> dict[str, Any]:
    window = (trace[-1].submit_s - trace[0].submit_s) if trace else 0.0
    work = sum(j.duration_s * j.gpus for j in trace)
    return {
        "name": sc.name, "file": path, "onprem_gpus": sc.onprem_gpus, "grace_s": sc.grace_s,
        "offered_load": round(work / (sc.onprem_gpus * window), 4) if window else None,
        "checkpoint_interval_s": sc.checkpoint_interval_s,
        "restart_overhead_s": sc.restart_overhead_s, "cycle_s": sc.cycle_s,
        "cloud_pools": [c.name for c in sc.cloud], "seed": sc.seed,
    }


def _one(trace: list[TraceJob], sc: Scenario, pol: SimPolicy, progress: Any,
         detail: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    report = (lambda f: progress.__setitem__(pol.name, f)) if progress is not None else None
    out = Simulator(trace, sc, pol, report, detail).run()
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def simulate(trace_path: str | Path, scenario_path: str | Path,
             policies: list[str] | None = None, *, limit: int | None = None,
             workers: int | None = None, detail: bool = False,
             overrides: dict[str, dict[str, Any]] | None = None,
             on_progress: Callable[[dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Replay the trace under each policy. Raises SpecError for a bad trace/scenario/policy.

    `overrides` adds named variants: {"name": {"base": POLICY, **PolicyConfig fields}}.
    """
    sc = load_scenario(scenario_path)
    trace = read_trace(trace_path, limit)
    pols = resolve(policies or NAMES, sc.grace_s, sc.restart_overhead_s, sc.policy,
                   variants=overrides)
    n = workers or min(len(pols), os.cpu_count() or 1)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    if n <= 1:
        shared: dict[str, float] = {}
        for p in pols:
            results[p.name] = _one(trace, sc, p, shared, detail)
            if on_progress:
                on_progress(dict(shared))
    else:
        ctx = mp.get_context("fork")
        with ctx.Manager() as mgr:
            shared = mgr.dict({p.name: 0.0 for p in pols})
            with ProcessPoolExecutor(n, mp_context=ctx) as ex:
                futs = {p.name: ex.submit(_one, trace, sc, p, shared, detail) for p in pols}
                while not all(f.done() for f in futs.values()):
                    if on_progress:
                        on_progress(dict(shared))
                    time.sleep(0.2)
                results = {k: f.result() for k, f in futs.items()}
            if on_progress:
                on_progress(dict(shared))
    return {
        "trace": {"file": str(trace_path), "jobs": len(trace),
                  "gpu_hours": round(sum(j.duration_s * j.gpus for j in trace) / 3600, 1)},
        "scenario": scenario_summary(sc, trace, str(scenario_path)),
        "policies": results,
        "wall_s": round(time.perf_counter() - t0, 2),
    }

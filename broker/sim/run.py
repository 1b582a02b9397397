"""Run several policies over one trace and scenario; the result is one JSON-able dict.

Policies run in parallel worker processes (one per core), the longest first; each reports its
progress. A baseline run in several configurations (broker.sim.policies.STRONGEST) reports
the one with the lower low-class p95 completion time, naming it under `config` and the
others' figures under `alternatives`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from broker.sim.policies import NAMES, SimPolicy, resolve
from broker.sim.scenario import Scenario, load_scenario
from broker.sim.simulator import Simulator
from broker.sim.trace import TraceJob, read_trace


def scenario_summary(sc: Scenario, trace: list[TraceJob], path: str) -> dict[str, Any]:
    """What the replay assumed (every assumption that could favour a policy is here)."""
    window = (trace[-1].submit_s - trace[0].submit_s) if trace else 0.0
    work = sum(j.duration_s * j.gpus for j in trace)
    return {
        "name": sc.name, "file": path, "onprem_gpus": sc.onprem_gpus, "grace_s": sc.grace_s,
        "offered_load": round(work / (sc.onprem_gpus * window), 4) if window else None,
        "checkpoint_on_signal": sc.checkpoint_on_signal,
        "checkpoint_save_s": sc.checkpoint_save_s,
        "checkpoint_interval_s": sc.checkpoint_interval_s,
        "checkpoint_intervals": sc.checkpoint_intervals,
        "deadlines": sc.deadlines, "deadline_fraction": sc.deadline_fraction,
        "deadline_slack": sc.deadline_slack,
        "restart_overhead_s": sc.restart_overhead_s, "cycle_s": sc.cycle_s,
        "runtime_estimates": sc.runtime_estimates, "reservations": sc.reservations,
        "min_run_s": sc.min_run_s,
        "cloud_pools": {c.name: {"market": c.market.value, "usd_per_node_hour": c.price_per_node_hour,
                                 "on_demand_usd_per_node_hour": c.on_demand_price,
                                 "max_nodes": c.max_nodes,
                                 "interruption_rate_per_h": c.interruption_rate_per_h,
                                 "stockouts_per_day": c.stockouts_per_day,
                                 "stockout_mean_s": c.stockout_mean_s} for c in sc.cloud},
        "seed": sc.seed,
    }


def _low_p95(r: dict[str, Any]) -> float:
    v = r["jct_s"]["low"]["p95"]
    return float("inf") if v is None else float(v)


def _one(trace: list[TraceJob], sc: Scenario, pol: SimPolicy, progress: Any,
         detail: bool, key: str) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    report = (lambda f: progress.__setitem__(key, f)) if progress is not None else None
    out = Simulator(trace, sc, pol, report, detail).run()
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    out["cpu_s"] = round(time.process_time() - c0, 2)  # on a shared machine, the fairer figure
    return out


# What forked workers replay: set before the pool forks them, so they inherit the trace, the
# scenario and the policies instead of unpickling them per task (mypyc-compiled frozen
# dataclasses do not unpickle; and the trace is large).
_FORKED: tuple[list[TraceJob], Scenario, list[SimPolicy]] | None = None


def _one_forked(i: int, progress: Any, detail: bool, key: str) -> dict[str, Any]:
    assert _FORKED is not None, "set before the workers fork"
    trace, sc, pols = _FORKED
    return _one(trace, sc, pols[i], progress, detail, key)


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
    return simulate_loaded(trace, sc, policies, trace_path=str(trace_path),
                           scenario_path=str(scenario_path), workers=workers, detail=detail,
                           overrides=overrides, on_progress=on_progress)


def simulate_loaded(trace: list[TraceJob], sc: Scenario, policies: list[str] | None = None, *,
                    trace_path: str = "", scenario_path: str = "", workers: int | None = None,
                    detail: bool = False, overrides: dict[str, dict[str, Any]] | None = None,
                    on_progress: Callable[[dict[str, float]], None] | None = None) -> dict[str, Any]:
    """simulate() for a trace and scenario already in memory."""
    pols = resolve(policies or NAMES, sc, sc.policy, variants=overrides, strongest=True)
    # the slowest first (as measured on the shared trace: the preempting policies search for
    # victims; EASY walks reservations), so the workers finish close together
    order = {("onepool-onprem", ""): 0, ("onepool", ""): 1, ("naive-preempt", ""): 2,
             ("fifo", "easy"): 3, ("partitioned", ""): 4}
    pols.sort(key=lambda p: order.get((p.name, p.variant), 5))
    n = workers or min(len(pols), os.cpu_count() or 1)
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    keys = [f"{p.name}[{p.variant}]" if p.variant else p.name for p in pols]
    if n <= 1:
        shared: MutableMapping[str, float] = {}
        for k, p in zip(keys, pols, strict=True):
            runs.append(_one(trace, sc, p, shared, detail, k))
            if on_progress:
                on_progress(dict(shared))
    else:
        global _FORKED
        ctx = mp.get_context("fork")
        _FORKED = (trace, sc, pols)
        try:
            with ctx.Manager() as mgr:
                shared = mgr.dict({k: 0.0 for k in keys})
                with ProcessPoolExecutor(n, mp_context=ctx) as ex:
                    futs = [ex.submit(_one_forked, i, shared, detail, k) for i, k in enumerate(keys)]
                    while not all(f.done() for f in futs):
                        if on_progress:
                            on_progress(dict(shared))
                        time.sleep(0.2)
                    runs = [f.result() for f in futs]
                if on_progress:
                    on_progress(dict(shared))
        finally:
            _FORKED = None
    results: dict[str, Any] = {}
    for p, r in zip(pols, runs, strict=True):
        if p.variant:
            r["config"] = p.variant
        prev = results.get(p.name)
        if prev is None:
            results[p.name] = r
            continue
        better, worse = (r, prev) if _low_p95(r) < _low_p95(prev) else (prev, r)
        alts = {**prev.pop("alternatives", {}), **r.pop("alternatives", {})}
        alts[worse["config"]] = {"jct_s_low_p95": _low_p95(worse),
                                 "wait_s_multinode_p99": worse["wait_s_multinode"]["p99"],
                                 "onprem_occupancy": worse["onprem_occupancy"]}
        better["alternatives"] = alts
        results[p.name] = better
    order_out = policies or NAMES
    results = {k: results[k] for k in order_out if k in results} | results
    cpu = sum(r["cpu_s"] for r in runs)
    return {
        "cpu_s": round(cpu, 2),  # every replay's CPU time, the strongest-baseline extras included
        "trace": {"file": trace_path, "jobs": len(trace),
                  "gpu_hours": round(sum(j.duration_s * j.gpus for j in trace) / 3600, 1)},
        "scenario": scenario_summary(sc, trace, scenario_path),
        "policies": results,
        "wall_s": round(time.perf_counter() - t0, 2),
    }

"""Rebalancing on and off: replay the shared 60-day trace under `onepool` (cloud pools) and
`onepool-onprem` with the live broker's rebalancing rules (broker.policy.rebalance and
.defrag, replayed by broker.sim.rebalance) on and off, and write bench/results/rebalance.json
with the cost and gang-wait differences.

    .venv/bin/python bench/rebalance.py [--trace T] [--scenario S] [--limit N | --quick] [--every S]

Each policy runs off, on, and on with the corrected rule (broker.policy.rebalance_realized:
each round scales a move's expected saving by what the finished moves before it realized).
`summary.<policy>.rebalance_expected_breakdown` splits the expected saving by what it rests
on and gives what finished moves realized (broker.sim.rebalance.BREAKDOWN).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from broker.policy.rebalance import RebalanceConfig  # noqa: E402
from broker.sim.policies import resolve  # noqa: E402
from broker.sim.run import scenario_summary  # noqa: E402
from broker.sim.scenario import load_scenario  # noqa: E402
from broker.sim.simulator import Simulator  # noqa: E402
from broker.sim.trace import read_trace  # noqa: E402

TRACE = HERE.parent.parent / "shared" / "data" / "traces" / "ms_itp_2021.csv"
SCENARIO = HERE / "scenarios" / "itp.yaml"
OUT = HERE / "results"
POLICIES = ("onepool", "onepool-onprem")
QUICK_JOBS = 10_000
KEEP = ("jobs_completed", "cloud_cost_usd", "cost_per_gpu_hour", "cloud_gpu_hours", "wait_s",
        "wait_s_multinode", "jct_s", "preemptions", "lost_gpu_hours_preemption",
        "onprem_occupancy", "rebalance", "wall_s")
ASSUMPTIONS = [
    # each one favours rebalancing (and so onepool); see broker/sim/rebalance.py
    "the checkpoint a move asks for always commits, within checkpoint_save_s (30 s)",
    "checkpoint egress between pools is free (the simulator has no checkpoint sizes)",
    "restart overhead of a moved job is the scenario's 180 s, as for any resumed attempt",
    "prices and interruption rates do not move during the trace, so moves that first launch "
    "nodes elsewhere (on-demand to spot, spot to spot, off a spiking pool) are not replayed",
    "a finished move's realized saving (what the corrected run learns from) counts the per-GPU "
    "saving over the moved attempt's true remaining time when it left on-prem or emptied its rented "
    "node (less the node's idle timeout), else 0; it does not see displacement (work the queue "
    "would have put on the GPUs the moved job took, which then rents instead)",
    "jobs' remaining run times are unknown to the policy (known_durations as in the scenario): "
    "a job is expected to run as long again as it has run (this works against moving)",
]


def one(args: tuple[str, str, str, int | None, Any, float]) -> tuple[str, Any, dict[str, Any]]:
    """One replay: `on` is False (off), True (on) or "corrected" (on, each round's estimate
    scaled by what past moves realized: broker.policy.rebalance_realized)."""
    trace_path, scenario_path, name, limit, on, every = args
    sc = load_scenario(scenario_path)
    trace = read_trace(trace_path, limit)
    (pol,) = resolve([name], sc, sc.policy)
    t0 = time.perf_counter()
    r = Simulator(trace, sc, pol, rebalance=RebalanceConfig() if on else None, rebalance_every_s=every,
                  rebalance_corrected=on == "corrected").run()
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    return name, on, {k: r[k] for k in KEEP if k in r}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="the first 10,000 jobs (about a minute); "
                    "writes rebalance_quick.json")
    ap.add_argument("--every", type=float, default=300.0, help="rebalance interval, simulated s")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if a.quick:
        a.limit = a.limit or QUICK_JOBS
    jobs = [(a.trace, a.scenario, n, a.limit, on, a.every) for n in POLICIES
            for on in (False, True, "corrected")]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as ex:
        runs = list(ex.map(one, jobs))
    res: dict[str, Any] = {n: {} for n in POLICIES}
    for n, on, m in runs:
        res[n]["corrected" if on == "corrected" else "on" if on else "off"] = m
    sc = load_scenario(a.scenario)
    summary = {}
    for n in POLICIES:
        off, on = res[n]["off"], res[n]["on"]
        summary[n] = {
            "cloud_cost_usd_off": off["cloud_cost_usd"], "cloud_cost_usd_on": on["cloud_cost_usd"],
            "cloud_cost_change": _pct(on["cloud_cost_usd"], off["cloud_cost_usd"]),
            "cost_per_gpu_hour_off": off["cost_per_gpu_hour"],
            "cost_per_gpu_hour_on": on["cost_per_gpu_hour"],
            "gang_wait_p95_s_off": off["wait_s_multinode"]["p95"],
            "gang_wait_p95_s_on": on["wait_s_multinode"]["p95"],
            "gang_wait_p99_s_off": off["wait_s_multinode"]["p99"],
            "gang_wait_p99_s_on": on["wait_s_multinode"]["p99"],
            "wait_p95_s_all_off": off["wait_s"]["all"]["p95"],
            "wait_p95_s_all_on": on["wait_s"]["all"]["p95"],
            **{f"rebalance_{k}": v for k, v in on.get("rebalance", {}).items()},
            "realized_cloud_saving_usd": round(off["cloud_cost_usd"] - on["cloud_cost_usd"], 2),
            "corrected": {"cloud_cost_usd": res[n]["corrected"]["cloud_cost_usd"],
                          "realized_cloud_saving_usd": round(off["cloud_cost_usd"]
                                                             - res[n]["corrected"]["cloud_cost_usd"], 2),
                          "gang_wait_p95_s": res[n]["corrected"]["wait_s_multinode"]["p95"],
                          "gang_wait_p99_s": res[n]["corrected"]["wait_s_multinode"]["p99"],
                          **res[n]["corrected"].get("rebalance", {})},
        }
    out = {"trace": Path(a.trace).name, "limit": a.limit, "rebalance_every_s": a.every,
           "rebalance_config": RebalanceConfig().__repr__(),
           "scenario": scenario_summary(sc, read_trace(a.trace, a.limit), _rel(a.scenario)),
           "assumptions_favouring_onepool": ASSUMPTIONS, "summary": summary, "runs": res,
           "wall_s": round(time.perf_counter() - t0, 1)}
    OUT.mkdir(parents=True, exist_ok=True)
    name = "rebalance_quick.json" if a.quick else "rebalance.json"
    (OUT / name).write_text(json.dumps(out, indent=2) + "\n")
    for n, s in summary.items():
        print(f"{n:<15} cloud cost ${s['cloud_cost_usd_off']:,.0f} -> ${s['cloud_cost_usd_on']:,.0f} "
              f"({s['cloud_cost_change']}), "
              f"$/GPU-h {s['cost_per_gpu_hour_off']} -> {s['cost_per_gpu_hour_on']}; "
              f"gang wait p95 {_h(s['gang_wait_p95_s_off'])} -> {_h(s['gang_wait_p95_s_on'])}, "
              f"p99 {_h(s['gang_wait_p99_s_off'])} -> {_h(s['gang_wait_p99_s_on'])}; "
              f"moves {s.get('rebalance_moves')} (defrag {s.get('rebalance_defrag_moves')}), "
              f"GPU-h lost to moves {s.get('rebalance_lost_gpu_hours_rebalance')}; "
              f"expected net ${s.get('rebalance_expected_net_saving_usd', 0):,.0f} vs realized "
              f"${s['realized_cloud_saving_usd']:,.0f}; corrected: cloud cost "
              f"${s['corrected']['cloud_cost_usd']:,.0f}, moves {s['corrected'].get('moves')}")
    print(f"wrote {OUT / name} in {out['wall_s']} s")


def _pct(new: float, old: float) -> str:
    return f"{(new - old) / old * 100:+.1f}%" if old else "n/a"


def _h(s: float) -> str:
    return f"{s / 3600:.1f}h"


def _rel(path: str) -> str:
    """A path as the repository names it (no absolute worktree path in the results)."""
    p = Path(path).resolve()
    return str(p.relative_to(HERE.parent)) if p.is_relative_to(HERE.parent) else p.name


if __name__ == "__main__":
    main()

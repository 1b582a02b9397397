"""The quota benchmark (issue 28): the shared trace with team quotas, honoured or ignored.

    .venv/bin/python bench/quotas.py [--quick] [--limit N] [--trace T] [--scenario S]

Replays bench/scenarios/itp_quotas.yaml (the shared ITP scenario with quotas for eight teams,
1,056 of 1,200 on-prem GPUs) under the on-prem policy twice: with quotas (within-quota work
reclaims borrowed work at once, and is never a victim by class), and with quotas ignored
(PolicyConfig.quotas False: the policy before them, on the very same jobs). Reports the
guaranteed teams' wait within their quota (the jobs whose team's GPUs in use plus theirs were
within its nominal at submission: p50/p95/p99), and what the guarantee costs: every class's
p95 wait, on-prem occupancy (that idle quota is still lent), preemptions and GPU-hours lost
to them. -> bench/results/quotas.json (with a `summary`). `--quick`: the first 15,000 jobs.

Assumptions that favour quotas are in the scenario file's header (nominals close to demand).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from broker.sim.run import simulate_loaded  # noqa: E402
from broker.sim.scenario import load_scenario  # noqa: E402
from broker.sim.trace import read_trace  # noqa: E402

TRACE = Path("/work/shared/data/traces/ms_itp_2021.csv")
SCENARIO = HERE / "scenarios" / "itp_quotas.yaml"
OUT = HERE / "results" / "quotas.json"
POLICY = "onepool-onprem"
KEEP = ("wait_s_within_quota", "wait_s", "jct_s", "onprem_occupancy", "idle_while_waiting_gpu_hours",
        "preemptions", "lost_gpu_hours_preemption", "jobs_completed", "cpu_s")


def replay(trace: list[Any], scenario: Path, quotas: bool) -> dict[str, Any]:
    sc = load_scenario(scenario)
    sc = sc.model_copy(update={"policy": {**sc.policy, POLICY: {**sc.policy.get(POLICY, {}),
                                                                "quotas": quotas}}})
    r = simulate_loaded(trace, sc, [POLICY], workers=1, trace_path=TRACE.name,
                        scenario_path=f"bench/scenarios/{scenario.name}")
    p = r["policies"][POLICY]
    return {"scenario": r["scenario"], **{k: p[k] for k in KEEP}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="the first 15,000 jobs")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    limit = 15_000 if args.quick and args.limit is None else args.limit
    trace = read_trace(args.trace, limit)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    runs = {"quotas": replay(trace, Path(args.scenario), True),
            "quotas ignored": replay(trace, Path(args.scenario), False)}
    wall = time.perf_counter() - t0
    scenario = runs["quotas"].pop("scenario")
    runs["quotas ignored"].pop("scenario")
    on, off = runs["quotas"], runs["quotas ignored"]
    summary = {
        "jobs": len(trace),
        "within_quota_jobs": on["wait_s_within_quota"]["jobs"],
        "within_quota_wait_p95_s": {"quotas": on["wait_s_within_quota"]["p95"],
                                    "quotas_ignored": off["wait_s_within_quota"]["p95"]},
        "within_quota_wait_p99_s": {"quotas": on["wait_s_within_quota"]["p99"],
                                    "quotas_ignored": off["wait_s_within_quota"]["p99"]},
        **{f"{c}_wait_p95_s": {"quotas": on["wait_s"][c]["p95"], "quotas_ignored": off["wait_s"][c]["p95"]}
           for c in ("all", "high", "normal", "low")},
        "onprem_occupancy": {"quotas": on["onprem_occupancy"], "quotas_ignored": off["onprem_occupancy"]},
        "preemptions": {"quotas": on["preemptions"], "quotas_ignored": off["preemptions"]},
        "lost_gpu_hours_preemption": {"quotas": on["lost_gpu_hours_preemption"],
                                      "quotas_ignored": off["lost_gpu_hours_preemption"]},
    }
    out = {"summary": summary, "runs": runs, "scenario": scenario,
           "assumptions": ["nominal quotas about 0.9 of each funded team's share of the trace's "
                           "GPU-hours (scenario header)", "the scenario's own: half the victims "
                           "checkpoint on the signal, learned runtime estimates, grace 60 s"],
           "machine": {"cores": os.cpu_count(), "load_average_1m_before": round(load0, 2),
                       "load_average_1m_after": round(os.getloadavg()[0], 2),
                       "wall_s": round(wall, 1)},
           "quick": limit is not None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"{len(trace):,} jobs, two replays: {wall:.1f} s wall (load average {load0:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after); wrote {args.out}")


if __name__ == "__main__":
    main()

"""Fixed against advised checkpoint intervals (issue 31): replay the shared 60-day trace under the
`onepool` policy with every attempt saving every 30 minutes (fixed) and with each attempt taking
the live broker's advised interval at its start (broker.policy.intervals via broker.sim.intervals),
and write bench/results/checkpoint_intervals.json: GPU-hours lost to stops, GPU-hours spent
saving, their sum, and the effect on completion times and cloud cost.

    .venv/bin/python bench/checkpoint_intervals.py [--quick] [--limit N] [--trace T] [--scenario S]

--quick replays the first 8,000 jobs (about a minute on two cores).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.trace_variants import POLICY, arguments, pct, run_all, write  # noqa: E402
from broker.sim.policies import resolve  # noqa: E402
from broker.sim.run import scenario_summary  # noqa: E402
from broker.sim.scenario import load_scenario  # noqa: E402
from broker.sim.simulator import Simulator  # noqa: E402
from broker.sim.trace import read_trace  # noqa: E402

# (name, scenario overrides): who saves on the signal decides how much a periodic save matters
VARIANTS = [
    ("half_save_on_signal", {}),
    ("none_save_on_signal", {"checkpoint_on_signal": 0.0}),
    ("none_save_on_signal_save_60s", {"checkpoint_on_signal": 0.0, "checkpoint_save_s": 60.0}),
]
ASSUMPTIONS = [
    "a save costs checkpoint_save_s of the job's GPUs and the advice knows that cost exactly (the "
    "live broker measures it; here it is the scenario's constant): favours advised",
    "time spent saving is counted but does not slow the job (as background uploads); both modes alike",
    "stop rates are learned per class over the whole replay so far, with the 24 h catalog prior; "
    "spot interruption rates are the Spot Advisor's (10-15% a month), so stops are mostly preemptions",
    "a job that saves on the signal loses nothing to a preemption, yet its periodic saves are still "
    "counted: the advice does not know which jobs save on the signal (works against advised)",
]
KEEP = ("jobs_completed", "lost_gpu_hours_preemption", "lost_gpu_hours_interruption", "preemptions",
        "cloud_cost_usd", "jct_s", "checkpoints", "wall_s")


def one(args: tuple[str, str, int | None, str, dict[str, Any], str]) -> tuple[str, str, dict[str, Any]]:
    trace_path, scenario_path, limit, variant, over, mode = args
    sc = load_scenario(scenario_path).model_copy(update={**over, "checkpoint_intervals": mode})
    (pol,) = resolve([POLICY], sc, sc.policy)
    t0 = time.perf_counter()
    r = Simulator(read_trace(trace_path, limit), sc, pol).run()
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    return variant, mode, {k: r[k] for k in KEEP if k in r}


def lost(m: dict[str, Any]) -> float:
    return round(m["lost_gpu_hours_preemption"] + m["lost_gpu_hours_interruption"], 2)


def waste(m: dict[str, Any]) -> float:
    return round(lost(m) + m["checkpoints"]["saving_gpu_hours"], 2)


def main() -> None:
    a, limit = arguments()
    jobs = [(a.trace, a.scenario, limit, v, over, mode)
            for v, over in VARIANTS for mode in ("fixed", "advised")]
    t0 = time.perf_counter()
    runs = run_all(one, jobs, a.workers)
    res: dict[str, dict[str, Any]] = {v: {} for v, _ in VARIANTS}
    for v, mode, m in runs:
        res[v][mode] = m
    summary = {}
    for v, _ in VARIANTS:
        f, d = res[v]["fixed"], res[v]["advised"]
        summary[v] = {
            "lost_gpu_hours_fixed": lost(f), "lost_gpu_hours_advised": lost(d),
            "saving_gpu_hours_fixed": f["checkpoints"]["saving_gpu_hours"],
            "saving_gpu_hours_advised": d["checkpoints"]["saving_gpu_hours"],
            "waste_gpu_hours_fixed": waste(f), "waste_gpu_hours_advised": waste(d),
            "waste_change": pct(waste(d), waste(f)),
            "mean_interval_s_advised": d["checkpoints"]["mean_interval_s"],
            "jct_p50_s_fixed": f["jct_s"]["all"]["p50"], "jct_p50_s_advised": d["jct_s"]["all"]["p50"],
            "cloud_cost_usd_fixed": f["cloud_cost_usd"], "cloud_cost_usd_advised": d["cloud_cost_usd"],
        }
    sc = load_scenario(a.scenario)
    out = {"trace": Path(a.trace).name, "limit": limit, "policy": POLICY,
           "scenario": {**scenario_summary(sc, read_trace(a.trace, limit), Path(a.scenario).name),
                        "variants": dict(VARIANTS)},
           "assumptions": ASSUMPTIONS, "summary": summary, "runs": res,
           "wall_s": round(time.perf_counter() - t0, 1)}
    path = write("checkpoint_intervals", limit, out)
    for v, s in summary.items():
        print(f"{v:<30} lost {s['lost_gpu_hours_fixed']:,.1f} -> {s['lost_gpu_hours_advised']:,.1f} GPU-h, "
              f"saving {s['saving_gpu_hours_fixed']:,.1f} -> {s['saving_gpu_hours_advised']:,.1f} GPU-h, "
              f"waste {s['waste_gpu_hours_fixed']:,.1f} -> {s['waste_gpu_hours_advised']:,.1f} "
              f"({s['waste_change']}); mean advised interval {s['mean_interval_s_advised']:,.0f} s")
    print(f"wrote {path} in {out['wall_s']} s")



if __name__ == "__main__":
    main()

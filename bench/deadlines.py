"""Deadlines (issue 31): replay the shared 60-day trace under the `onepool` policy with a share of
the jobs given a deadline, run always on demand (never spot), always on spot (only spot), or by
the live broker's rule (broker.policy.deadlines: spot while on pace, safe in time; replayed by
broker.sim.deadlines), and write bench/results/deadlines.json: their cost and deadline misses.

    .venv/bin/python bench/deadlines.py [--quick] [--limit N] [--trace T] [--scenario S]

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
from broker.sim.scenario import Scenario, load_scenario  # noqa: E402
from broker.sim.simulator import Simulator  # noqa: E402
from broker.sim.trace import read_trace  # noqa: E402
from broker.spec import Market  # noqa: E402

MODES = ("on_demand", "spot", "aware")
FRACTION, SLACK = 0.2, 2.0
# (name, scenario overrides, spot reclaims per node-hour or None: the scenario's)
VARIANTS: list[tuple[str, dict[str, Any], float | None]] = [
    ("scenario_spot", {}, None),
    ("spot_reclaims_0.05_per_h", {}, 0.05),
    ("tight_slack_1.5", {"deadline_slack": 1.5}, 0.05),
]
ASSUMPTIONS = [
    f"{FRACTION:.0%} of the jobs (by hash) have a deadline at submission + {SLACK:g} x their duration "
    "(1.5 x in the tight variant); every class keeps its own priority",
    "every job reports its progress exactly (the trace duration is its total): the rule always has a "
    "measure (favours aware; a live job that reports nothing runs safe)",
    "the modes override the class's spot policy for jobs with a deadline only: on_demand = never, "
    "spot = only, aware = only while on pace, never when it must run safe",
    "the spot pools' reclaim rate is the scenario's (Spot Advisor, 10-15% a month: 0.000183 per node-hour) "
    "or 0.05 per node-hour (one per 20 node-hours) where the variant says; stock-outs as the scenario "
    "(once a day for 2 h on average); on-demand pools are always in stock",
    "jobs save on the signal as the scenario says (half of them); the rule moves a job back from on "
    "demand to spot only if it saves on the signal (a move must not lose work)",
    "cost: the GPU-seconds of the deadline jobs' attempts at their pools' price (on-prem at "
    "onprem_usd_per_gpu_hour), not the idle node time the rented pools also bill",
]


def with_variant(sc: Scenario, over: dict[str, Any], rate: float | None) -> Scenario:
    cloud = sc.cloud if rate is None else [
        p.model_copy(update={"interruption_rate_per_h": rate}) if p.market is Market.SPOT else p
        for p in sc.cloud]
    return sc.model_copy(update={"deadline_fraction": FRACTION, "deadline_slack": SLACK, **over,
                                 "cloud": cloud})


Job = tuple[str, str, int | None, str, dict[str, Any], float | None, str]


def one(args: Job) -> tuple[str, str, dict[str, Any]]:
    trace_path, scenario_path, limit, variant, over, rate, mode = args
    sc = with_variant(load_scenario(scenario_path), over, rate).model_copy(update={"deadlines": mode})
    (pol,) = resolve([POLICY], sc, sc.policy)
    t0 = time.perf_counter()
    r = Simulator(read_trace(trace_path, limit), sc, pol).run()
    return variant, mode, {**r["deadlines"], "interruptions": r["interruptions"],
                           "all_cloud_cost_usd": r["cloud_cost_usd"],
                           "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    a, limit = arguments()
    jobs = [(a.trace, a.scenario, limit, v, over, rate, m) for v, over, rate in VARIANTS for m in MODES]
    t0 = time.perf_counter()
    runs = run_all(one, jobs, a.workers)
    res: dict[str, dict[str, Any]] = {v: {} for v, _, _ in VARIANTS}
    for v, m, r in runs:
        res[v][m] = r
    summary = {}
    for v, _, _ in VARIANTS:
        r = res[v]
        summary[v] = {f"{k}_{m}": r[m][k] for m in MODES for k in ("cost_usd", "cloud_cost_usd", "missed")}
        summary[v] |= {"jobs_with_deadline": r["aware"]["jobs"],
                       "aware_cost_vs_on_demand": pct(r["aware"]["cost_usd"], r["on_demand"]["cost_usd"]),
                       "aware_moves_off_spot": r["aware"]["moved_off_spot"],
                       "aware_moves_back_to_spot": r["aware"]["moved_back_to_spot"]}
    sc = load_scenario(a.scenario)
    out = {"trace": Path(a.trace).name, "limit": limit, "policy": POLICY,
           "scenario": {**scenario_summary(sc, read_trace(a.trace, limit), Path(a.scenario).name),
                        "variants": {v: {**over, "spot_interruption_rate_per_h": rate}
                                     for v, over, rate in VARIANTS}},
           "assumptions": ASSUMPTIONS, "summary": summary, "runs": res,
           "wall_s": round(time.perf_counter() - t0, 1)}
    path = write("deadlines", limit, out)
    for v, s in summary.items():
        print(f"{v:<26} {s['jobs_with_deadline']} jobs: " + "; ".join(
            f"{m} ${s[f'cost_usd_{m}']:,.0f} (cloud ${s[f'cloud_cost_usd_{m}']:,.0f}), "
            f"{s[f'missed_{m}']} missed" for m in MODES))
    print(f"wrote {path} in {out['wall_s']} s")



if __name__ == "__main__":
    main()

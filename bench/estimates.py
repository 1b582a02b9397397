"""Back-test of the estimate at submit (issue 29) on the shared trace.

    .venv/bin/python bench/estimates.py [--skip N] [--limit N] [--every K] [--warmup-h H] [--quick]

The default (about 90 s): jobs 8,000 to 40,000 of the trace (about 28 days), every 20th
submit after the first day forecast; --quick: 2,000 jobs, a few seconds.

The simulator replays a sample of the trace (`--limit` jobs by submit time, after the first
`--skip`) under
the `onepool-onprem` policy of bench/scenarios/itp.yaml. At every K-th submit after a warm-up
(the pools fill first), the estimator (broker.policy.forecast, the one `onepool submit
--dry-run` runs) predicts the job's start from the replay's state at that moment: the
snapshot plan() would see, with runtime estimates learned per (team, shape) as the
simulator learns them. The replay then goes on, and each job's actual first start is
compared with its prediction.

Reported (bench/results/estimates.json): for the jobs that waited at least 10 minutes, the
median of |predicted wait - actual wait| / actual wait (`summary.median_relative_error`) and
the fraction whose actual start fell inside the predicted p10-p90 band
(`summary.within_p10_p90`); the same for every predicted job; the sample, the scenario and
the wall time. Goals: median relative error <= 0.3, band >= 0.8.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from broker.policy import Snapshot  # noqa: E402
from broker.policy.forecast import WAIT_BAND, forecast  # noqa: E402
from broker.sim.policies import resolve  # noqa: E402
from broker.sim.scenario import load_scenario  # noqa: E402
from broker.sim.simulator import Simulator  # noqa: E402
from broker.sim.state import SimJob  # noqa: E402
from broker.sim.trace import read_trace  # noqa: E402

TRACE = HERE.parent.parent / "shared" / "data" / "traces" / "ms_itp_2021.csv"  # or --trace
SCENARIO = HERE / "scenarios" / "itp.yaml"
POLICY = "onepool-onprem"
LONG_WAIT_S = 600.0


class EstimatingSimulator(Simulator):
    """The simulator, forecasting every `every`-th arrival after `warmup_s`."""

    def __init__(self, *args: Any, every: int, warmup_s: float, unknown_s: float,
                 band: dict[str, float], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.every, self.warmup_s, self.unknown_s, self.band = every, warmup_s, unknown_s, band
        self.arrivals = 0
        self.predicted: dict[int, dict[str, Any]] = {}
        self.forecast_s = 0.0

    def _arrive(self, j: SimJob) -> None:
        super()._arrive(j)
        self.arrivals += 1
        if self.now < self.warmup_s or self.arrivals % self.every:
            return
        scope = self.scope_of(j.team)
        if j.jid not in self.scope_pending[scope]:
            return  # could never run here
        snap = Snapshot(now=self.now, pools=tuple(self._pool_view(p) for p in self.scope_pools[scope]),
                        running=tuple(self.scope_views[scope].values()),
                        pending=tuple(self.scope_pending[scope].values()), teams=self._teams_now(),
                        config=self.cfg)
        t0 = time.perf_counter()
        f = forecast(snap, j.jid, unknown_runtime_s=self.unknown_s, band=self.band, cycle_s=self.sc.cycle_s)
        self.forecast_s += time.perf_counter() - t0
        self.predicted[j.jid] = {"submit": self.now, "p10": f.start_p10, "p50": f.start_p50,
                                 "p90": f.start_p90, "pool": f.pool}


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median relative error of the predicted wait (relative to the actual wait, at least a
    minute) and the share inside the band."""
    rel = [abs((r["p50"] - r["submit"]) - r["wait"]) / max(r["wait"], 60.0) for r in rows
           if r["p50"] is not None]
    band = [r["p10"] is not None and r["p90"] is not None and r["p10"] <= r["start"] <= r["p90"]
            for r in rows]
    return {"jobs": len(rows),
            "median_relative_error": round(statistics.median(rel), 3) if rel else None,
            "within_p10_p90": round(sum(band) / len(band), 3) if band else None,
            "median_actual_wait_s": round(statistics.median(r["wait"] for r in rows), 1) if rows else None,
            "median_abs_error_s": round(statistics.median(
                abs((r["p50"] - r["submit"]) - r["wait"]) for r in rows if r["p50"] is not None), 1)
            if rows else None,
            "median_signed_error_s": round(statistics.median(
                (r["p50"] - r["submit"]) - r["wait"] for r in rows if r["p50"] is not None), 1)
            if rows else None,
            "no_start_predicted": sum(r["p50"] is None for r in rows),
            "before_p10": _share([r["p10"] is not None and r["start"] < r["p10"] for r in rows]),
            "after_p90": _share([r["p90"] is not None and r["start"] > r["p90"] for r in rows])}


def _share(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 3) if flags else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--skip", type=int, default=8000, help="start at this job of the trace (the "
                    "first 8,000 are where WAIT_BAND was chosen: the default reports on jobs never tuned on)")
    ap.add_argument("--limit", type=int, default=32000, help="replay N jobs of the trace")
    ap.add_argument("--band", default=f"{WAIT_BAND['p10']},{WAIT_BAND['p90']}",
                    help="p10,p90 as ratios of the predicted wait (default broker.policy.forecast.WAIT_BAND)")
    ap.add_argument("--every", type=int, default=20, help="forecast every K-th submit")
    ap.add_argument("--warmup-h", type=float, default=24.0, help="no forecast before this (pools fill)")
    ap.add_argument("--unknown-runtime-h", type=float, default=4.0)
    ap.add_argument("--quick", action="store_true", help="a smaller sample (2,000 jobs, every 20th)")
    ap.add_argument("--out", default=str(HERE / "results" / "estimates.json"))
    args = ap.parse_args()
    if args.quick:
        args.limit, args.every, args.warmup_h = 2000, 20, 12.0
    trace = read_trace(args.trace, args.skip + args.limit)[args.skip:]
    band = dict(zip(("p10", "p90"), map(float, args.band.split(",")), strict=True))
    sc = load_scenario(args.scenario)
    [pol] = resolve([POLICY], sc, sc.policy)
    t0 = time.perf_counter()
    start = trace[0].submit_s if trace else 0.0
    sim = EstimatingSimulator(trace, sc, pol, every=args.every, warmup_s=start + args.warmup_h * 3600,
                              unknown_s=args.unknown_runtime_h * 3600, band=band)
    sim.run()
    rows = []
    for jid, p in sim.predicted.items():
        j = sim.jobs[jid - 1]
        if j.first_start is None:
            continue
        rows.append({**p, "start": j.first_start, "wait": j.first_start - p["submit"]})
    long = [r for r in rows if r["wait"] >= LONG_WAIT_S]
    result = {
        "sample": {"trace": Path(args.trace).name, "skipped_jobs": args.skip, "jobs": len(trace),
                   "window_h": round((trace[-1].submit_s - start) / 3600, 1) if trace else 0,
                   "forecast_every": args.every, "warmup_h": args.warmup_h,
                   "forecasts": len(sim.predicted), "started": len(rows)},
        "scenario": {"file": Path(args.scenario).name, "name": sc.name, "policy": POLICY,
                     "runtime_estimates": sc.runtime_estimates,
                     "unknown_runtime_h": args.unknown_runtime_h, "wait_band": band,
                     "cycle_s": sc.cycle_s},
        "summary": {**score(long), "long_wait_s": LONG_WAIT_S},
        "all_predicted": score(rows),
        "wall_s": round(time.perf_counter() - t0, 1),
        "forecast_cpu_s": round(sim.forecast_s, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

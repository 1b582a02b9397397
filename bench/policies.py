"""The policy benchmark: replay the shared 60-day trace under every policy.

    .venv/bin/python bench/policies.py [--trace T] [--scenario S] [--limit N]
                                       [--sweep] [--tradeoff] [--seeds] [--workers N]

- default: one `simulate` run of the five policies on the scenario (bench/scenarios/itp.yaml:
  1,200 GPUs, checkpoint_on_signal 0.5, learned runtime estimates, spot stock-outs) ->
  bench/results/policies.json, policies.md (the table), policies.png (wait CDF per class per
  policy; on-prem occupancy over time), targets.json / targets.md (issue 11's targets, met or
  not, from this one run).
- --sweep: the same trace on two capacities, 1,200 and 900 GPUs (node counts scaled), with
  the defaults side by side (the default: low work aged after 6 h, no reservations; without
  aging: reservations none / EASY 1 / EASY 4; patience before preempting on or off; and
  main's previous rules: 4 reservations holding free GPUs, preempting at once) ->
  sweep.json / sweep.md. A default that helps one load and hurts the other shows
  here; it is what PolicySettings' defaults were chosen by.
- --seeds: the default, the rule before it (fair share ordering waiting gangs too) and two
  shorter aging thresholds against FIFO on the same trace under other scenario seeds
  (SEEDS: which jobs get which class, GPU type and checkpoint on signal; stock-out times)
  -> seeds.json / seeds.md, with the geometric mean of each ratio. One seed's multi-node
  p99 is the wait of a handful of gangs; this shows how much of a ratio is that seed's.
- --tradeoff: onepool-onprem variants on the open problem (low-class p95 completion vs
  FIFO's, multi-node p99 wait vs FIFO's, fixed capacity) -> tradeoff.json / tradeoff.png,
  drawn against the previous front (tradeoff_previous.json: main at d0fb298, its own
  benchmark, whose FIFO held 4 reservations and whose victims all checkpointed on the signal)
  -> tradeoff.json / tradeoff.md / tradeoff.png.

Every figure is from a replay: nothing here is typed in. Wall times depend on the machine's
load (it is shared): the load average is recorded with the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
import compiled  # noqa: E402  (bench/compiled.py: --compiled)

sys.path.insert(0, compiled.import_root(sys.argv))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from broker.sim.metrics import CLASSES  # noqa: E402
from broker.sim.report import markdown  # noqa: E402
from broker.sim.run import simulate_loaded  # noqa: E402
from broker.sim.scenario import Scenario, load_scenario  # noqa: E402
from broker.sim.trace import read_trace  # noqa: E402

TRACE = HERE.parent.parent / "shared" / "data" / "traces" / "ms_itp_2021.csv"
SCENARIO = HERE / "scenarios" / "itp.yaml"
OUT = HERE / "results"
CAPACITIES = (1200, 900)

# Defaults compared by --sweep (onepool-onprem; FIFO picks its own strongest).
PREVIOUS = {"reservations": 4, "easy": False, "preemptible_backfill": False, "preempt_after_s": 0,
            "checkpoint_align_s": 0, "promote_after_s": None}  # main at d0fb298's rules
NO_AGING = {"promote_after_s": None}
BEFORE = {  # the previous defaults, drawn in both the sweep and the front
    "one reservation, no aging (the default before)": {
        "base": "onepool-onprem", "reservations": 1, **NO_AGING},
    "no reservations, no aging": {"base": "onepool-onprem", **NO_AGING},
}
PREVIOUS_RULES = {"previous rules (hold 4, preempt at once)": {"base": "onepool-onprem", **PREVIOUS}}
GANGS_BY_SHARE = {"fair share orders waiting gangs (the rule before)": {
    "base": "onepool-onprem", "oldest_gangs_first": False}}
SEEDS = (7, 8, 9, 10, 11)  # 7: bench/scenarios/itp.yaml's
SEED_VARIANTS = {**GANGS_BY_SHARE,  # the rule before, and aging thresholds inside both goals on seed 7
                 "aged after 3h": {"base": "onepool-onprem", "promote_after_s": 10800},
                 "aged after 4h": {"base": "onepool-onprem", "promote_after_s": 14400}}
DEFAULTS = {
    "onepool-onprem": {"base": "onepool-onprem"},
    **GANGS_BY_SHARE,
    **BEFORE,
    "4 reservations, no aging": {"base": "onepool-onprem", "reservations": 4, **NO_AGING},
    "impatient (preempt at once, no alignment)": {"base": "onepool-onprem", "preempt_after_s": 0,
                                                  "checkpoint_align_s": 0},
    **PREVIOUS_RULES,
}
# The open problem's knobs (--tradeoff): reservations, patience, and aging (of low gangs, of
# all low work). The default ages all low work after 6 h and holds no reservations.
TRADEOFF = {
    "default": {"base": "onepool-onprem"},
    **GANGS_BY_SHARE,
    **BEFORE,
    "EASY, 4 reservations, no aging": {"base": "onepool-onprem", "reservations": 4, **NO_AGING},
    "patience 30 min": {"base": "onepool-onprem", "preempt_after_s": 1800},
    "one reservation for gangs only, no aging": {
        "base": "onepool-onprem", "reservations": 1, "reserve_gangs_only": True, **NO_AGING},
    "one reservation, low gangs aged after 24h": {
        "base": "onepool-onprem", "reservations": 1, "promote_after_s": 86400,
        "promote_gangs_only": True},
    "low work aged after 3h": {"base": "onepool-onprem", "promote_after_s": 10800},
    "low work aged after 12h": {"base": "onepool-onprem", "promote_after_s": 43200},
    "low work aged after 24h": {"base": "onepool-onprem", "promote_after_s": 86400},
    # a reservation's preemptible backfill is preempted over and over once low work ages
    "one reservation, low work aged after 6h": {"base": "onepool-onprem", "reservations": 1},
    **PREVIOUS_RULES,
}


def plot(result: dict[str, Any], path: Path) -> None:
    pols = list(result["policies"])
    fig, axes = plt.subplots(1, len(CLASSES) + 1, figsize=(5 * (len(CLASSES) + 1), 4.2))
    qs = list(range(101))
    for ax, c in zip(axes, CLASSES, strict=False):
        for p in pols:
            cdf = result["policies"][p].get("wait_cdf", {}).get(c) or []
            if cdf:
                ax.plot([max(v, 1) / 3600 for v in cdf], qs, label=p)
        ax.set_xscale("log")
        ax.set_xlabel("queue wait (hours, log)")
        ax.set_ylabel("percent of jobs")
        ax.set_title(f"wait CDF: {c}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    for p in pols:
        occ = result["policies"][p].get("occupancy_hourly") or []
        ax.plot([h / 24 for h in range(len(occ))], occ, label=p, linewidth=0.7)
    ax.set_xlabel("day")
    ax.set_ylabel("on-prem occupancy")
    ax.set_title("on-prem occupancy (hourly)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratio(a: float | None, b: float | None, digits: int | None = 3) -> float | None:
    """a / b, rounded to `digits` (None: unrounded); None when a is missing or b is 0."""
    if a is None or not b:
        return None
    return a / b if digits is None else round(a / b, digits)


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 11's targets, each with the measured value, the goal and whether it is met.

    `met` compares the unrounded value with the goal (0.3503 does not meet <= 0.35); `value`
    is shown to 4 decimals, enough to show why."""
    P, sc = r["policies"], r["scenario"]
    op, cl, fifo, naive = (P.get(k) for k in ("onepool-onprem", "onepool", "fifo", "naive-preempt"))
    rows: list[dict[str, Any]] = []

    def row(policy: str, what: str, value: float | None, goal: float | None, sense: str = "<=") -> None:
        met = None if value is None or goal is None else (value <= goal if sense == "<=" else value >= goal)
        shown = None if value is None else round(value, 4)
        rows.append({"policy": policy, "target": what, "value": shown, "goal": goal, "met": met})

    if op is not None:
        grace = sc["grace_s"]
        row("onepool-onprem", "urgent+high within allowance: p95 wait (s) <= grace + 60",
            op["wait_s_within_allowance"]["all"]["p95"], grace + 60)
        delivered = op["gpu_hours_delivered"]
        lost = op["lost_gpu_hours_preemption"]
        if naive is not None:
            row("onepool-onprem", "lost GPU-h / naive-preempt's <= 0.5",
                _ratio(lost, naive["lost_gpu_hours_preemption"], None), 0.5)
        row("onepool-onprem", "lost GPU-h / delivered <= 0.5%", 100 * lost / delivered, 0.5)
        load = sc["offered_load"] or 1.0
        row("onepool-onprem", "occupancy / min(1, offered load) >= 0.97",
            op["onprem_occupancy"] / min(1.0, load), 0.97, ">=")
        row("onepool-onprem", "idle GPU-h while a fitting job waits / delivered <= 1%",
            100 * op["idle_while_waiting_gpu_hours"] / delivered, 1.0)
        if fifo is not None:
            row("onepool-onprem", "low p95 completion / FIFO's <= 1.15 (open problem, with the next)",
                _ratio(op["jct_s"]["low"]["p95"], fifo["jct_s"]["low"]["p95"], None), 1.15)
            row("onepool-onprem", "multi-node p99 wait / FIFO's <= 1 (open problem)",
                _ratio(op["wait_s_multinode"]["p99"], fifo["wait_s_multinode"]["p99"], None), 1.0)
    if cl is not None and fifo is not None:
        row("onepool", "multi-node p99 wait / FIFO's <= 0.25",
            _ratio(cl["wait_s_multinode"]["p99"], fifo["wait_s_multinode"]["p99"], None), 0.25)
        row("onepool", "low p95 completion / FIFO's <= 1",
            _ratio(cl["jct_s"]["low"]["p95"], fifo["jct_s"]["low"]["p95"], None), 1.0)
    if cl is not None:
        row("onepool", "cloud cost / same node-hours on demand <= 0.35",
            _ratio(cl["cloud_cost_usd"], cl["cloud_cost_on_demand_usd"], None), 0.35)
    on = (r.get("machine") or {}).get("compiled") or "pure Python"
    row("all five", f"replay wall time (s) on this machine <= 60 ({on})", r["wall_s"], 60)
    row("all five", "replay CPU time (s) / 2 cores <= 60 (what 2 free cores would take, at best)",
        r["cpu_s"] / 2, 60)
    return rows


def targets_md(rows: list[dict[str, Any]]) -> str:
    out = ["| policy | target | measured | goal | met |", "|---|---|---|---|---|"]
    for x in rows:
        met = "-" if x["met"] is None else ("yes" if x["met"] else "**no**")
        out.append(f"| {x['policy']} | {x['target']} | {x['value']} | {x['goal']} | {met} |")
    return "\n".join(out) + "\n"


def scaled(sc: Scenario, gpus: int) -> Scenario:
    """The scenario with its on-prem node counts scaled to about `gpus` GPUs."""
    f = gpus / sc.onprem_gpus
    pools = [p.model_copy(update={"nodes": max(1, round(p.nodes * f))}) for p in sc.onprem]
    return sc.model_copy(update={"onprem": pools, "name": f"{sc.name.split('-')[0]}-{gpus}"})


def summary(m: dict[str, Any]) -> dict[str, Any]:
    return {"config": m.get("config"), "onprem_occupancy": m["onprem_occupancy"],
            "idle_while_waiting_gpu_hours": m["idle_while_waiting_gpu_hours"],
            "jct_s_low_p95": m["jct_s"]["low"]["p95"], "wait_s_multinode_p99": m["wait_s_multinode"]["p99"],
            "wait_s_within_allowance_p95": m["wait_s_within_allowance"]["all"]["p95"],
            "lost_gpu_hours_preemption": m["lost_gpu_hours_preemption"],
            "preemptions": m["preemptions"], "gpu_hours_delivered": m["gpu_hours_delivered"],
            "wall_s": m["wall_s"], "cpu_s": m.get("cpu_s")}


def sweep(trace: list[Any], sc: Scenario, args: argparse.Namespace) -> None:
    out: dict[str, Any] = {"capacities": {}}
    lines = ["| capacity | policy | occupancy | idle GPU-h while a job fits | low p95 completion | "
             "multi-node p99 wait | lost GPU-h | urgent+high p95 wait |", "|" + "---|" * 8]
    for gpus in CAPACITIES:
        s = scaled(sc, gpus)
        r = simulate_loaded(trace, s, ["fifo", "naive-preempt", *DEFAULTS], overrides=DEFAULTS,
                            workers=args.workers, trace_path=str(args.trace),
                            scenario_path=f"{args.scenario} scaled to {s.onprem_gpus} GPUs")
        out["capacities"][str(s.onprem_gpus)] = {
            "offered_load": r["scenario"]["offered_load"], "wall_s": r["wall_s"],
            "policies": {k: summary(m) for k, m in r["policies"].items()}}
        for k, m in r["policies"].items():
            lines.append(f"| {s.onprem_gpus} (load {r['scenario']['offered_load']}) | {k} | "
                         f"{m['onprem_occupancy']:.3f} | {m['idle_while_waiting_gpu_hours']:,.0f} | "
                         f"{m['jct_s']['low']['p95'] / 3600:.1f} h | "
                         f"{m['wait_s_multinode']['p99'] / 86400:.1f} d | "
                         f"{m['lost_gpu_hours_preemption']:,.0f} | "
                         f"{_h(m['wait_s_within_allowance']['all']['p95'])} |")
        print(f"capacity {s.onprem_gpus}: {r['wall_s']:.0f} s wall", flush=True)
    (OUT / "sweep.json").write_text(json.dumps(out, indent=2) + "\n")
    (OUT / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _h(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} s"


def tradeoff(trace: list[Any], sc: Scenario, args: argparse.Namespace) -> None:
    r = simulate_loaded(trace, sc, ["fifo", *TRADEOFF], overrides=TRADEOFF, workers=args.workers,
                        trace_path=str(args.trace), scenario_path=str(args.scenario))
    fifo = r["policies"]["fifo"]
    rows = []
    for n in TRADEOFF:
        m = r["policies"][n]
        rows.append({"variant": n,
                     "low_p95_jct_vs_fifo": _ratio(m["jct_s"]["low"]["p95"], fifo["jct_s"]["low"]["p95"]),
                     "multinode_p99_wait_vs_fifo": _ratio(m["wait_s_multinode"]["p99"],
                                                          fifo["wait_s_multinode"]["p99"]),
                     **summary(m)})
        print(f"{n:<32} low p95 JCT x{rows[-1]['low_p95_jct_vs_fifo']} of fifo, multi-node p99 "
              f"wait x{rows[-1]['multinode_p99_wait_vs_fifo']} of fifo, occupancy "
              f"{m['onprem_occupancy']:.3f}, lost {m['lost_gpu_hours_preemption']:,.0f} GPU-h", flush=True)
    doc = {"fifo": {"config": fifo.get("config"), **summary(fifo)}, "variants": rows,
           "scenario": r["scenario"], "wall_s": r["wall_s"]}
    (OUT / "tradeoff.json").write_text(json.dumps(doc, indent=2) + "\n")
    previous = json.loads((OUT / "tradeoff_previous.json").read_text())
    md = ["| front | variant | low p95 completion / FIFO's | multi-node p99 wait / FIFO's | "
          "occupancy | lost GPU-h |", "|---|---|---|---|---|---|"]
    for label, pts in (("this", rows), ("previous (d0fb298)", previous["variants"])):
        for p in pts:
            md.append(f"| {label} | {p['variant']} | {p['low_p95_jct_vs_fifo']} | "
                      f"{p['multinode_p99_wait_vs_fifo']} | {p['onprem_occupancy']} | "
                      f"{p['lost_gpu_hours_preemption']:,.0f} |")
    (OUT / "tradeoff.md").write_text("\n".join(md) + "\n")
    fig, ax = plt.subplots(figsize=(7, 5.5))
    for series, pts, marker in (("this front", rows, "o"), ("previous front", previous["variants"], "x")):
        xs = [p["low_p95_jct_vs_fifo"] for p in pts]
        ys = [p["multinode_p99_wait_vs_fifo"] for p in pts]
        ax.scatter(xs, ys, marker=marker, label=series)
        for p, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(p["variant"], (x, y), fontsize=7)
    ax.axvline(1.15, ls="--", c="grey")
    ax.axhline(1.0, ls="--", c="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("low-priority p95 completion / FIFO's (log)")
    ax.set_ylabel("multi-node p99 wait / FIFO's (log)")
    ax.set_title("the open problem: target is the lower-left box")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "tradeoff.png", dpi=110)
    plt.close(fig)


def seeds(trace: list[Any], sc: Scenario, args: argparse.Namespace) -> None:
    names = ["onepool-onprem", *SEED_VARIANTS]
    ratios: dict[str, dict[str, list[float]]] = {n: {"low": [], "multinode": []} for n in names}
    out: dict[str, Any] = {"seeds": {}}
    md = ["| seed | policy | low p95 completion / FIFO's | multi-node p99 wait / FIFO's | "
          "occupancy | lost GPU-h |", "|---|---|---|---|---|---|"]
    for seed in SEEDS:
        s = sc.model_copy(update={"seed": seed})
        r = simulate_loaded(trace, s, ["fifo", *names], overrides=SEED_VARIANTS,
                            workers=args.workers, trace_path=str(args.trace),
                            scenario_path=f"{args.scenario} with seed {seed}")
        fifo = r["policies"]["fifo"]
        out["seeds"][str(seed)] = {"fifo": summary(fifo)}
        for n in names:
            m = r["policies"][n]
            low = _ratio(m["jct_s"]["low"]["p95"], fifo["jct_s"]["low"]["p95"], None)
            mn = _ratio(m["wait_s_multinode"]["p99"], fifo["wait_s_multinode"]["p99"], None)
            assert low is not None and mn is not None
            ratios[n]["low"].append(low)
            ratios[n]["multinode"].append(mn)
            out["seeds"][str(seed)][n] = {"low_p95_jct_vs_fifo": low, "multinode_p99_wait_vs_fifo": mn,
                                          **summary(m)}
            md.append(f"| {seed} | {n} | {low:.3f} | {mn:.3f} | {m['onprem_occupancy']:.3f} | "
                      f"{m['lost_gpu_hours_preemption']:,.0f} |")
        print(f"seed {seed}: {r['wall_s']:.0f} s wall", flush=True)
    out["geometric_mean"] = {n: {k: round(_gmean(v), 3) for k, v in ratios[n].items()} for n in names}
    for n in names:
        g = out["geometric_mean"][n]
        md.append(f"| geometric mean | {n} | {g['low']} | {g['multinode']} | | |")
    (OUT / "seeds.json").write_text(json.dumps(out, indent=2) + "\n")
    (OUT / "seeds.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--tradeoff", action="store_true")
    ap.add_argument("--seeds", action="store_true")
    ap.add_argument("--skip-main", action="store_true", help="only --sweep / --tradeoff / --seeds")
    ap.add_argument("--compiled", action="store_true",
                    help="replay on a mypyc-compiled copy of the policy and simulator (bench/compiled.py)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    sc = load_scenario(args.scenario)
    trace = read_trace(args.trace, args.limit)
    if not args.skip_main:
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        r = simulate_loaded(trace, sc, detail=True, workers=args.workers, trace_path=str(args.trace),
                            scenario_path=str(args.scenario))
        wall = time.perf_counter() - t0
        r["machine"] = {"cores": os.cpu_count(), "load_average_1m_before": round(load0, 2),
                        "load_average_1m_after": round(os.getloadavg()[0], 2),
                        "compiled": compiled.label()}
        slim = {**r, "policies": {k: {m: v for m, v in p.items()
                                      if m not in ("wait_cdf", "occupancy_hourly")}
                                  for k, p in r["policies"].items()}}
        (OUT / "policies.json").write_text(json.dumps(slim, indent=2) + "\n")
        (OUT / "policies.md").write_text(markdown(r))
        plot(r, OUT / "policies.png")
        rows = targets(r)
        (OUT / "targets.json").write_text(json.dumps(rows, indent=2) + "\n")
        (OUT / "targets.md").write_text(targets_md(rows))
        print(markdown(r))
        print(targets_md(rows))
        print(f"all five policies: {wall:.1f} s wall on {os.cpu_count()} cores "
              f"({compiled.label() or 'pure Python'}; load average "
              f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after); wrote {OUT}/policies.*, targets.*")
    if args.sweep:
        sweep(trace, sc, args)
    if args.tradeoff:
        tradeoff(trace, sc, args)
    if args.seeds:
        seeds(trace, sc, args)


if __name__ == "__main__":
    main()

"""The policy benchmark: replay the shared 60-day trace under every policy, and write
bench/results/policies.json, policies.md (the table) and policies.png (wait CDF per class
per policy; on-prem occupancy over time), plus the low-vs-gang trade-off of the backfill
knob (bench/results/tradeoff.json/.png) when --tradeoff is given.

    .venv/bin/python bench/policies.py [--trace T] [--scenario S] [--limit N] [--tradeoff]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from broker.sim.metrics import CLASSES  # noqa: E402
from broker.sim.report import markdown  # noqa: E402
from broker.sim.run import simulate  # noqa: E402

TRACE = HERE.parent.parent / "shared" / "data" / "traces" / "ms_itp_2021.csv"
SCENARIO = HERE / "scenarios" / "itp.yaml"
OUT = HERE / "results"

# The trade-off between low-priority completion and gang waits: how many blocked jobs hold
# capacity (reservations; the default is 4), and aging gangs one class after 48 h.
TRADEOFF = {
    "res1": {"base": "onepool-onprem", "reservations": 1},
    "res4 (default)": {"base": "onepool-onprem", "reservations": 4},
    "res16": {"base": "onepool-onprem", "reservations": 16},
    "res4+age-gangs-48h": {"base": "onepool-onprem", "reservations": 4, "promote_after_s": 172800},
}


def plot(result: dict, path: Path) -> None:
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


def tradeoff(args: argparse.Namespace) -> None:
    names = ["fifo", *TRADEOFF]
    r = simulate(args.trace, args.scenario, names, limit=args.limit, overrides=TRADEOFF)
    fifo = r["policies"]["fifo"]
    rows = []
    for n in TRADEOFF:
        m = r["policies"][n]
        rows.append({"variant": n,
                     "low_p95_jct_vs_fifo": m["jct_s"]["low"]["p95"] / fifo["jct_s"]["low"]["p95"],
                     "multinode_p99_wait_vs_fifo": m["wait_s_multinode"]["p99"]
                     / fifo["wait_s_multinode"]["p99"],
                     "onprem_occupancy": m["onprem_occupancy"],
                     "lost_gpu_hours_preemption": m["lost_gpu_hours_preemption"],
                     "preemptions": m["preemptions"], "wall_s": m["wall_s"]})
        print(f"{n:<20} low p95 JCT x{rows[-1]['low_p95_jct_vs_fifo']:.2f} of fifo, "
              f"multi-node p99 wait x{rows[-1]['multinode_p99_wait_vs_fifo']:.2f} of fifo, "
              f"occupancy {m['onprem_occupancy']:.3f}, lost {m['lost_gpu_hours_preemption']:,.0f} GPU-h")
    (OUT / "tradeoff.json").write_text(json.dumps(rows, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for row in rows:
        ax.scatter(row["low_p95_jct_vs_fifo"], row["multinode_p99_wait_vs_fifo"])
        ax.annotate(row["variant"], (row["low_p95_jct_vs_fifo"],
                                                    row["multinode_p99_wait_vs_fifo"]))
    ax.axvline(1.15, ls="--", c="grey")
    ax.axhline(1.0, ls="--", c="grey")
    ax.set_xlabel("low-priority p95 completion / fifo's")
    ax.set_ylabel("multi-node p99 wait / fifo's")
    ax.set_title("backfill reservations: the trade-off")
    fig.tight_layout()
    fig.savefig(OUT / "tradeoff.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--tradeoff", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    r = simulate(args.trace, args.scenario, limit=args.limit, detail=True)
    wall = time.perf_counter() - t0
    slim = {**r, "policies": {k: {m: v for m, v in p.items()
                                  if m not in ("wait_cdf", "occupancy_hourly")}
                              for k, p in r["policies"].items()}}
    (OUT / "policies.json").write_text(json.dumps(slim, indent=2) + "\n")
    (OUT / "policies.md").write_text(markdown(r))
    plot(r, OUT / "policies.png")
    print(markdown(r))
    print(f"all five policies: {wall:.1f} s wall on this machine; wrote {OUT}/policies.*")
    if args.tradeoff:
        tradeoff(args)


if __name__ == "__main__":
    main()

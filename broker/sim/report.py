"""Render a simulate() result: one row per metric, one column per policy."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from broker.sim.metrics import CLASSES


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 120:
        return f"{v:.0f}s"
    if v < 7200:
        return f"{v / 60:.1f}m"
    if v < 172800:
        return f"{v / 3600:.1f}h"
    return f"{v / 86400:.1f}d"


def rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    pols = list(result["policies"])
    P = result["policies"]
    out: list[list[str]] = []

    def add(label: str, f: Any) -> None:
        out.append([label] + [f(P[p]) for p in pols])

    add("configuration (strongest of)", lambda m: m.get("config") or "-")
    add("jobs completed", lambda m: f"{m['jobs_completed']:,}")
    add("jobs unplaceable (waits censored)", lambda m: f"{m['jobs_unplaceable']:,}")
    add("GPU-hours delivered", lambda m: f"{m['gpu_hours_delivered']:,.0f}")
    add("on-prem occupancy", lambda m: f"{m['onprem_occupancy']:.3f}")
    add("idle GPU-h while a fitting job waited", lambda m: f"{m['idle_while_waiting_gpu_hours']:,.0f}")
    for c in [*CLASSES, "all"]:
        add(f"wait p50/p95/p99 {c}", lambda m, c=c: " / ".join(
            _fmt_s(m["wait_s"][c][k]) for k in ("p50", "p95", "p99")))
    for c in [*CLASSES, "all"]:
        add(f"completion p50/p95 {c}", lambda m, c=c: " / ".join(
            _fmt_s(m["jct_s"][c][k]) for k in ("p50", "p95")))
    add("wait p50/p95/p99 urgent+high within allowance", lambda m: " / ".join(
        _fmt_s(m["wait_s_within_allowance"]["all"][k]) for k in ("p50", "p95", "p99")))
    add("wait p95/p99 multi-node (>8 GPUs)", lambda m: " / ".join(
        _fmt_s(m["wait_s_multinode"][k]) for k in ("p95", "p99")))
    add("preemptions", lambda m: f"{m['preemptions']:,}")
    add("GPU-h lost to preemption", lambda m: f"{m['lost_gpu_hours_preemption']:,.1f}")
    add("GPU-h lost to spot interruptions", lambda m: f"{m['lost_gpu_hours_interruption']:,.1f}")
    add("cloud GPU-hours", lambda m: f"{m['cloud_gpu_hours']:,.0f}")
    add("launches refused (stock-outs)", lambda m: f"{m['launches_refused']:,}")
    add("cloud cost USD", lambda m: f"{m['cloud_cost_usd']:,.0f}")
    add("same at on-demand USD", lambda m: f"{m['cloud_cost_on_demand_usd']:,.0f}")
    add("per rented pool: node-h, cost / on-demand", lambda m: "; ".join(
        f"{p}: {c['node_hours']:,.0f} h, {c['cost_usd'] / c['on_demand_usd']:.2f}"
        for p, c in m.get("cloud_by_pool", {}).items() if c["on_demand_usd"]) or "-")
    add("cost per delivered GPU-h", lambda m: "-" if m["cost_per_gpu_hour"] is None
        else f"${m['cost_per_gpu_hour']:.3f}")
    add("replay wall / CPU time", lambda m: f"{m['wall_s']:.1f}s / {m.get('cpu_s', 0):.1f}s")
    return ["metric", *pols], out


def title(result: dict[str, Any]) -> str:
    sc = result["scenario"]
    return (f"{sc['name']}: {result['trace']['jobs']:,} jobs, {sc['onprem_gpus']:,} on-prem GPUs, "
            f"offered load {sc['offered_load']}, checkpoint_on_signal {sc['checkpoint_on_signal']}, "
            f"runtime estimates {sc['runtime_estimates']}")


def rich_table(result: dict[str, Any]) -> Table:
    head, body = rows(result)
    t = Table(title=title(result))
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in body:
        t.add_row(*r)
    return t


def markdown(result: dict[str, Any]) -> str:
    head, body = rows(result)
    lines = [f"**{title(result)}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines) + "\n"

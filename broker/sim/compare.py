"""Comparing two replays' outcomes, for people: the difference of every number (`diff`) and
the rows a table shows (`table`). Plain Python (no simulator, no numpy), so the CLI's thin
client and the dashboard can show a replay's result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """b - a for every number both hold at the same key path (nested mappings walked; None
    where either side has no number)."""
    out: dict[str, Any] = {}
    for k in a.keys() & b.keys():
        x, y = a[k], b[k]
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out[k] = diff(x, y)
        elif _num(x) and _num(y):
            out[k] = round(float(y) - float(x), 4)
        elif x is None or y is None:
            out[k] = None
    return {k: out[k] for k in sorted(out)}


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def table(out: Mapping[str, Any]) -> list[dict[str, Any]]:
    """compare()'s result as rows for a person (the CLI's and the dashboard's table): each
    {"what", "unit" ("s", "usd", "gpu_h", "" ), "recorded", "current", "changed", "change"}."""
    a, b, rec = out["current"], out["changed"], out.get("recorded") or {}
    rows: list[dict[str, Any]] = []

    def row(what: str, path: tuple[str, ...], unit: str = "") -> None:
        def get(r: Mapping[str, Any]) -> Any:
            v: Any = r
            for k in path:
                v = v.get(k) if isinstance(v, Mapping) else None
            return v

        x, y = get(a), get(b)
        rows.append({"what": what, "unit": unit, "recorded": get(rec) if rec else None, "current": x,
                     "changed": y, "change": round(y - x, 4) if _num(x) and _num(y) else None})

    for c in ("urgent", "high", "normal", "low", "all"):
        row(f"mean wait, {c}", ("wait_s_mean", c), "s")
    for team in sorted(a["wait_s_by_team"]):
        row(f"mean wait, team {team}", ("wait_s_by_team", team, "mean"), "s")
    row("preemptions", ("preemptions",))
    row("lost GPU-hours, preemption", ("lost_gpu_hours_preemption",), "gpu_h")
    row("lost GPU-hours, interruption", ("lost_gpu_hours_interruption",), "gpu_h")
    row("cloud cost", ("cloud_cost_usd",), "usd")
    row("on-prem occupancy", ("onprem_occupancy",))
    row("jobs completed", ("jobs_completed",))
    return rows

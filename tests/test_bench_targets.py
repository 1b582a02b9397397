"""bench/policies.targets: a target is met on the unrounded value, never on a rounding."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # policies.py imports its sibling compiled.py
    try:
        spec = importlib.util.spec_from_file_location("bench_policies", BENCH / "policies.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def result(cloud_usd: float, on_demand_usd: float, cpu_s: float) -> dict[str, Any]:
    """A replay result holding only the onepool policy and the timings."""
    return {"policies": {"onepool": {"cloud_cost_usd": cloud_usd,
                                     "cloud_cost_on_demand_usd": on_demand_usd}},
            "scenario": {}, "machine": {}, "wall_s": 50.0, "cpu_s": cpu_s}


@pytest.mark.parametrize(("cloud_usd", "cpu_s", "cost_met", "cost_shown", "cpu_met"), [
    (35.0, 120.0, True, 0.35, True),           # exactly at both goals
    (35.032, 120.1, False, 0.3503, False),     # 0.3503 and 60.05 round to the goals, miss them
    (34.96, 119.9, True, 0.3496, True),
])
def test_a_target_is_met_on_the_unrounded_value(cloud_usd: float, cpu_s: float, cost_met: bool,
                                                cost_shown: float, cpu_met: bool) -> None:
    rows = {r["target"]: r for r in load().targets(result(cloud_usd, 100.0, cpu_s))}
    cost = rows["cloud cost / same node-hours on demand <= 0.35"]
    assert (cost["met"], cost["value"]) == (cost_met, cost_shown)
    cpu = next(r for t, r in rows.items() if t.startswith("replay CPU time"))
    assert cpu["met"] is cpu_met

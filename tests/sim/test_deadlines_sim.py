"""Deadlines in the simulator (broker.sim.deadlines): always on demand, always spot, and the live
rule, on the same jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.sim.policies import resolve
from broker.sim.simulator import Simulator
from broker.sim.trace import read_trace
from tests.sim.builders import job_id, scenario, write_trace

H = 3600.0


def cloud(rate: float) -> list[dict[str, Any]]:
    return [{"name": "spot", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8, "market": "spot",
             "price_per_node_hour": 8.0, "on_demand_price_per_node_hour": 24.0, "max_nodes": 10,
             "launch_latency_s": 120, "interruption_rate_per_h": rate, "idle_timeout_s": 600},
            {"name": "od", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8, "market": "on_demand",
             "price_per_node_hour": 24.0, "max_nodes": 10, "launch_latency_s": 120, "idle_timeout_s": 600}]


# The on-prem node is held by an urgent job all along; ten 8-GPU normal jobs of 3,000-3,450 s
# (32,250 s in all) arrive 100 s apart and must rent.
ROWS = [(job_id("urgent", 0), 0, 200_000, 8)] + [(job_id("normal", i), 10 + 100 * i, 3000 + 50 * i, 8)
                                                for i in range(10)]
WORK_H = 32_250 / H


def replay(tmp_path: Path, mode: str, rate: float, slack: float) -> dict[str, Any]:
    sc = scenario(cloud=cloud(rate), deadlines=mode, deadline_fraction=1.0, deadline_slack=slack,
                  spot={"normal": "allowed"})
    (pol,) = resolve(["onepool"], sc, sc.policy)
    return Simulator(read_trace(write_trace(tmp_path / "t.csv", ROWS)), sc, pol).run()["deadlines"]


def test_always_on_demand_and_always_spot_cost_what_their_prices_say(tmp_path: Path) -> None:
    od, spot = replay(tmp_path, "on_demand", 0.0, 3.0), replay(tmp_path, "spot", 0.0, 3.0)
    assert od["cloud_cost_usd"] == pytest.approx(WORK_H * 24.0, abs=0.01)  # $3/GPU-h x 8 GPUs
    assert spot["cloud_cost_usd"] == pytest.approx(WORK_H * 8.0, abs=0.01)
    assert od["jobs"] == 11 and od["missed"] == spot["missed"] == 0
    # the urgent job's deadline is kept on-prem, at $1/GPU-h: 200,000 s x 8 GPUs
    assert od["cost_usd"] - od["cloud_cost_usd"] == pytest.approx(200_000 / H * 8, abs=0.01)


@pytest.mark.parametrize(("rate", "slack"), [(0.0, 3.0), (2.0, 1.5), (2.0, 3.0)])
def test_the_rule_costs_less_than_on_demand_and_misses_less_than_spot(tmp_path: Path, rate: float,
                                                                     slack: float) -> None:
    od, spot, aware = (replay(tmp_path, m, rate, slack) for m in ("on_demand", "spot", "aware"))
    assert aware["cloud_cost_usd"] < od["cloud_cost_usd"]
    assert aware["missed"] <= spot["missed"] and aware["missed"] <= 2
    assert aware["moved_back_to_spot"] > 0
    if rate:
        assert spot["missed"] > aware["missed"] or spot["missed"] == 0


@pytest.mark.parametrize(("over", "field", "mentions"), [
    ({"deadlines": "sometimes"}, "deadlines", "'none', 'on_demand', 'spot' or 'aware'"),
    ({"deadline_fraction": 1.5}, "deadline_fraction", "less than or equal to 1"),
    ({"deadline_fraction": -0.1}, "deadline_fraction", "greater than or equal to 0"),
    ({"deadline_slack": 1.0}, "deadline_slack", "greater than 1"),
    ({"checkpoint_intervals": "auto"}, "checkpoint_intervals", "'fixed' or 'advised'"),
])
def test_bad_scenario_keys_name_the_field_and_the_allowed_values(over: dict, field: str,
                                                                 mentions: str) -> None:
    from broker.errors import SpecError
    from broker.sim.scenario import Scenario
    from broker.spec import validate

    base = scenario().model_dump(mode="json")
    with pytest.raises(SpecError) as e:
        validate(Scenario, {**base, **over}, "s.yaml")
    (line,) = [p for p in e.value.problems if p.startswith(f"{field}:")]
    assert mentions in line

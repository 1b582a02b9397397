"""Fixed and advised checkpoint intervals in the simulator (broker.sim.intervals), by hand."""

from __future__ import annotations

import pytest

from broker.policy.intervals import MAX_INTERVAL_S, IntervalFacts, advise
from broker.sim.intervals import IntervalMeter
from tests.sim.builders import scenario
from tests.sim.test_simulator import THREE, run

H = 3600.0
# The low job of THREE is killed at 1060 s (it does not save on the signal) and resumes at
# 2230 with all its 7200 s of work left (180 s restart overhead first); the urgent and normal
# jobs run 600 s each.
ADVISED_2ND = advise(IntervalFacts(save_s=30.0, run_s=1060.0, stops=1)).interval_s


@pytest.mark.parametrize(("mode", "saves", "mean_interval"), [
    # fixed: 7200 // 1800 = 4 saves of 30 s x 8 GPUs in the resumed attempt; none before
    ("fixed", 4, 1800.0),
    # advised: no stop seen yet on-prem, so the first three attempts save every MAX_INTERVAL_S;
    # the resume has seen one stop in 1060 s of its class (and the 24 h prior of 0)
    ("advised", 7200 // ADVISED_2ND, (3 * MAX_INTERVAL_S + ADVISED_2ND) / 4),
])
def test_saving_and_intervals_by_hand(tmp_path, mode: str, saves: float, mean_interval: float) -> None:
    result, _ = run(tmp_path, THREE, "onepool-onprem", checkpoint_on_signal=0.0, checkpoint_intervals=mode)
    ck = result["checkpoints"]
    assert ck["mode"] == mode
    assert ck["saving_gpu_hours"] == pytest.approx(saves * 30 * 8 / H, abs=0.005)
    assert ck["mean_interval_s"] == pytest.approx(mean_interval, abs=0.1)
    assert result["lost_gpu_hours_preemption"] == pytest.approx((1060 * 8 + 1440) / H, abs=0.01)
    assert ck["stops_per_run_hour"]["low"] == pytest.approx(1 / ((1060 + 7380) / H), abs=1e-4)


def test_the_prior_is_the_mean_rate_of_the_pools_a_spot_policy_allows() -> None:
    spot = [{"name": "s", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8, "market": "spot",
             "price_per_node_hour": 8.0, "on_demand_price_per_node_hour": 24.0, "max_nodes": 2,
             "interruption_rate_per_h": 0.6},
            {"name": "od", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8,
             "market": "on_demand", "price_per_node_hour": 24.0, "max_nodes": 2}]
    m = IntervalMeter(scenario(cloud=spot), "advised")
    # on-prem counts for every policy (rate 0): only = (0 + 0.6) / 2, allowed = (0 + 0.6 + 0) / 3
    want = {"never": 0.0, "allowed": 0.2, "only": 0.3}
    assert {k.value: v for k, v in m.prior.items()} == pytest.approx(want)
    with pytest.raises(ValueError, match="fixed or advised"):
        IntervalMeter(scenario(), "sometimes")  # type: ignore[arg-type]

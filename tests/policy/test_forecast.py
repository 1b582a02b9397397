"""The estimate at submit as a pure replay (issue 29): start band, pool and cost of a pending job
from the live queue, replayed forward through plan()."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.policy.forecast import WAIT_BAND, forecast, job_cost
from tests.policy.builders import NOW, job, pool, running, snap

FULL = {"a-0": 8}


@pytest.mark.parametrize(("case", "pools", "run", "pend", "want"), [
    ("free GPUs: starts now", [pool("a", nodes=1)], [], [job(1, gpus=8, estimate=600)],
     (NOW, NOW, NOW)),
    ("waits for the running job's end; the band scales the wait", [pool("a", nodes=1)],
     [running(10, 100, prio="normal", alloc=FULL, end=NOW + 100)], [job(1, gpus=8, estimate=600)],
     (NOW + 100 * WAIT_BAND["p10"], NOW + 100, NOW + 100 * WAIT_BAND["p90"])),
    ("behind an older job of the queue", [pool("a", nodes=1)],
     [running(10, 100, prio="normal", alloc=FULL, end=NOW + 100)],
     [job(2, gpus=8, estimate=200, submit=-5.0), job(1, gpus=8, estimate=600)],
     (NOW + 300 * WAIT_BAND["p10"], NOW + 300, NOW + 300 * WAIT_BAND["p90"])),
    ("no estimate of the running job: unknown_runtime_s", [pool("a", nodes=1)],
     [running(10, 100, prio="normal", alloc=FULL)], [job(1, gpus=8, estimate=600)],
     (NOW + 3600 * WAIT_BAND["p10"], NOW + 3600, NOW + 3600 * WAIT_BAND["p90"])),
])
def test_start_band(case, pools, run, pend, want):
    s = snap(pools, run, pend)
    f = forecast(s, 1, unknown_runtime_s=3600)
    assert (f.start_p10, f.start_p50, f.start_p90) == pytest.approx(want), case
    assert f.pool == "a" and f.gpu_type == "A100" and f.market == "onprem"


def test_never_within_horizon_when_no_pool_fits():
    f = forecast(snap([pool("a", nodes=1, gpus=4)], [], [job(1, gpus=8)]), 1)
    assert (f.start_p50, f.pool, f.cost_usd) == (None, None, None)


def test_cost_and_spot_risk():
    spot = replace(pool("s", market="spot", price=2.0), interruption_rate_per_h=0.5)
    j = job(1, gpus=4, estimate=7200)
    cost, risk = job_cost(j, spot, 7200, restart_s=60)
    assert cost == pytest.approx(4 * 2.0 * 2)  # 4 GPUs x $2 x 2 h
    # 0.5/h x 2 h = 1 interruption, losing half of 1800 s + 60 s of 4 GPUs at $2/h
    assert risk == pytest.approx(cost + (900 + 60) * 4 * 2.0 / 3600)
    f = forecast(snap([spot], [], [j]), 1)
    assert f.market == "spot" and f.cost_with_risk_usd == pytest.approx(risk)


def test_unknown_job_is_refused():
    with pytest.raises(KeyError, match="job 7 is not pending"):
        forecast(snap([pool("a")], [], [job(1)]), 7)


def test_cached_node_use_is_not_trusted_in_the_replay():
    """A node view carrying its use (as the simulator's do) describes the snapshot's running
    attempts: once the replay ends them, the GPUs are free (this job never started before)."""
    busy = replace(pool("a", nodes=1), nodes=(replace(pool("a", nodes=1).nodes[0], used=8),))
    f = forecast(snap([busy], [running(10, 100, prio="normal", alloc=FULL, end=NOW + 100)],
                      [job(1, gpus=8, estimate=600)]), 1)
    assert f.start_p50 == pytest.approx(NOW + 100)


def test_cycle_latency_widens_the_band():
    f = forecast(snap([pool("a", nodes=1)], [], [job(1, gpus=8, estimate=600)]), 1, cycle_s=30)
    assert (f.start_p10, f.start_p50, f.start_p90) == (NOW, NOW + 15, NOW + 30)

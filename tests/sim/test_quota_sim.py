"""The simulator replays quotas (issue 28): a team's job within its quota reclaims another
team's borrowed work at once; with quotas ignored (PolicyConfig.quotas False) it waits."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from broker.sim.policies import resolve
from broker.sim.simulator import Simulator
from broker.sim.trace import read_trace
from tests.sim.builders import job_id, scenario

BORROWER, OWNER = job_id("low", 0), job_id("low", 1)  # one class: nothing preempts by class


def _trace(path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time_s", "duration_s", "num_gpus", "gpu_type", "user",
                    "queue", "status"])
        w.writerow([BORROWER, 0, 36000, 8, "", "", "qb", ""])  # b borrows a's idle quota
        w.writerow([OWNER, 1000, 600, 8, "", "", "qa", ""])  # a wants it back
    return path


@pytest.mark.parametrize(("quotas", "owner_waits_at_most", "preemptions"),
                         [(True, 120, 1), (False, 40000, 0)], ids=["quotas", "ignored"])
def test_owner_reclaims_its_quota(tmp_path: Path, quotas: bool, owner_waits_at_most: float,
                                  preemptions: int) -> None:
    sc = scenario(teams=[{"name": "a", "queues": ["qa"], "quota": {"gpus": 8}},
                         {"name": "b", "queues": ["qb"]}],
                  default_team="b", policy={"onepool-onprem": {"quotas": quotas}})
    (pol,) = resolve(["onepool-onprem"], sc, sc.policy)
    sim = Simulator(read_trace(_trace(tmp_path / "t.csv")), sc, pol)
    result = sim.run()
    jobs = {j.trace.job_id: j for j in sim.jobs}
    assert jobs[OWNER].within_quota and not jobs[BORROWER].within_quota
    assert jobs[OWNER].wait <= owner_waits_at_most
    assert result["preemptions"] == preemptions
    assert result["wait_s_within_quota"]["jobs"] == 1
    if not quotas:
        assert jobs[OWNER].wait > 30000  # behind the borrower until it ends

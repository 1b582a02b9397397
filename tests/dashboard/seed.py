"""A seeded broker home for dashboard tests: two experiments, a preemption, egress, a budget."""

from __future__ import annotations

from pathlib import Path

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.spec import parse_config
from broker.state import ledger
from broker.state.model import Attempt, AttemptState, Job
from tests.conftest import config

POOLS = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 2, "price_per_node_hour": 8.0},
         {"name": "spot", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "market": "spot",
          "price_per_node_hour": 3.0}]
TEAMS = [{"name": "research", "budget_usd": 50.0}, {"name": "prod", "priority_allowance_gpus": 4}]


def seed(home: Path) -> Client:
    """Jobs and attempts written directly, then charged by the ledger on a fake clock."""
    clock = FakeClock(1_790_000_000.0)
    c = Client(home, clock=clock)
    c.apply(parse_config(config(pools=POOLS, teams=TEAMS)))
    t0 = clock.now()
    with c.store.session() as s:
        ledger.accrue(s, t0, c.config())
        rows = [("sweep-0", "research", "lr-sweep", "low", "a100-0", [0, 1], 0, 1800, 600.0, None),
                ("sweep-0", "research", "lr-sweep", "low", "spot-0", [0, 1], 2400, 5400, 0.0, 0.02),
                ("sweep-1", "research", "lr-sweep", "low", "a100-1", [0], 0, 5400, 0.0, None),
                ("hotfix", "prod", "release", "urgent", "a100-0", [0, 1], 1800, 3600, 0.0, None)]
        jobs: dict[str, Job] = {}
        for name, team, exp, prio, node, slots, a, b, lost, egress in rows:
            j = jobs.get(name) or Job(name=name, team=team, experiment=exp, priority=prio, command=["x"],
                                      submit_time=t0, queued_at=t0, state="SUCCEEDED")
            s.add(j)
            s.flush()
            jobs[name] = j
            j.attempts += 1
            s.add(Attempt(job_id=j.id, number=j.attempts, pool=node.split("-")[0], alloc=[[node, slots]],
                          priority=prio, started_at=t0 + a, ended_at=t0 + b, gpus=len(slots),
                          state=AttemptState.ENDED, end_reason="PREEMPTED" if lost else "COMPLETED",
                          cause="preempted_by=3" if lost else None, preempted_by=3 if lost else None,
                          lost_gpu_s=lost, egress_usd=egress or 0.0))
        s.flush()
        for t in range(0, 5401, 300):
            ledger.accrue(s, t0 + t, c.config())
    clock.advance(5400)
    return c

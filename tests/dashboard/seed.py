"""A seeded broker home for dashboard and money tests: an hour and a half of a small lab up to
now (the dashboard's clock is the system clock): two experiments, a preemption that lost work,
a spot interruption that lost none, egress, a job running now and one waiting, a team budget."""

from __future__ import annotations

import time
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
SPAN_S = 5400

# job, team, experiment, class, node, slots, start, end (None: running), end reason, cause, lost
# GPU-s, egress USD; times in seconds from the start.
ATTEMPTS = [
    ("sweep-0", "research", "lr-sweep", "low", "a100-0", [0, 1], 0, 1800, "PREEMPTED", "preempted_by=3",
     600.0, 0.0),
    ("sweep-1", "research", "lr-sweep", "low", "a100-1", [0], 0, 5400, "COMPLETED", None, 0.0, 0.0),
    ("hotfix", "prod", "release", "urgent", "a100-0", [0, 1], 1800, 3600, "COMPLETED", None, 0.0, 0.0),
    ("sweep-0", "research", "lr-sweep", "low", "spot-0", [0, 1], 2400, 5400, "COMPLETED", None, 0.0, 0.02),
    ("sweep-2", "research", "lr-sweep", "low", "spot-0", [0, 1], 300, 2000, "INTERRUPTED",
     "spot_interruption", 0.0, 0.0),
    ("sweep-2", "research", "lr-sweep", "low", "a100-1", [1], 3000, None, None, None, 0.0, 0.0),
]
PHASES = {"fetch_code_s": 0.25, "pull_image_s": 3.0, "setup_s": 0.01, "setup_cached": True}
STATES = {"sweep-0": "SUCCEEDED", "sweep-1": "SUCCEEDED", "hotfix": "SUCCEEDED", "sweep-2": "RUNNING"}


def seed(home: Path, start: float | None = None) -> Client:
    """Jobs and attempts written directly, then charged by the ledger on a fake clock from
    `start` (default: SPAN_S before now) to SPAN_S later. Returns a client on that clock."""
    clock = FakeClock(float(int(time.time()) - SPAN_S) if start is None else start)
    c = Client(home, clock=clock)
    c.apply(parse_config(config(pools=POOLS, teams=TEAMS)))
    t0 = clock.now()
    with c.store.session() as s:
        ledger.accrue(s, t0, c.config())
        jobs: dict[str, Job] = {}
        for name, team, exp, prio, node, slots, a, b, why, cause, lost, egress in ATTEMPTS:
            j = jobs.get(name) or Job(name=name, team=team, experiment=exp, priority=prio, command=["x"],
                                      submit_time=t0, queued_at=t0, state=STATES[name],
                                      user="alice" if name.startswith("sweep") else None,  # issue 28
                                      end_time=None if STATES[name] == "RUNNING" else t0 + SPAN_S)
            s.add(j)
            s.flush()
            jobs[name] = j
            j.attempts += 1
            j.preemptions += why == "PREEMPTED"
            s.add(Attempt(job_id=j.id, number=j.attempts, pool=node.split("-")[0], alloc=[[node, slots]],
                          priority=prio, started_at=t0 + a, ended_at=None if b is None else t0 + b,
                          gpus=len(slots), state=AttemptState.RUNNING if b is None else AttemptState.ENDED,
                          end_reason=why, cause=cause, lost_gpu_s=lost, egress_usd=egress,
                          preempted_by=3 if why == "PREEMPTED" else None, reached_step=12 if b else None,
                          progress_step=40 if b is None else None, progress_total=100 if b is None else None,
                          progress_at=t0 + SPAN_S - 10 if b is None else None,
                          progress_rate=0.05 if b is None else None,
                          # the running attempt's restart phases (issue 26)
                          phases=PHASES if b is None else None,
                          restart_overhead_s=6.5 if b is None else None))
        s.add(Job(name="eval", team="prod", experiment="release", priority="normal", command=["x"],
                  submit_time=t0 + 5000, queued_at=t0 + 5000, state="PENDING",
                  waiting_reason="head of the queue: holding 1 GPUs in a100"))
        s.flush()
        for t in range(0, SPAN_S + 1, 300):
            ledger.accrue(s, t0 + t, c.config())
    clock.advance(SPAN_S)
    return c

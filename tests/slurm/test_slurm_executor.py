"""The Executor contract (providers.base) as SlurmExecutor keeps it, against the real Slurm."""

from __future__ import annotations

import signal

from sqlmodel import select

from broker.control.slurm_pools import SlurmPools
from broker.state.model import Attempt
from providers.base import RankState
from tests.conftest import drive, train
from tests.slurm.conftest import POOL


def test_start_is_idempotent_per_attempt_also_from_a_new_broker_process(slurm_site, clock):
    c, eng = slurm_site()
    j = c.submit(name="x", team="research", command=train(40), gpus_per_node=1).id
    drive(eng, lambda: c.get(j).attempts == 1)  # Slurm may still be freeing the last test's GPUs
    with c.store.session() as s:
        a = s.exec(select(Attempt).where(Attempt.job_id == j)).one()
    h = dict(a.handles[0])
    ex = eng.slurm.executor
    again = ex.start(a.id, 0, ["true"], {}, node=a.alloc[0][0])
    assert again["job_id"] == h["job_id"]  # the same process (Slurm job), not a second one
    other = SlurmPools(c.store, clock).executor  # another broker process, after a crash
    adopted = other.start(a.id, 0, ["true"], {}, recover=True, node=a.alloc[0][0])
    assert adopted["job_id"] == h["job_id"] and adopted["name"] == h["name"]
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED", timeout=30)
    assert other.status(adopted).state == RankState.EXITED
    other.signal(adopted, signal.SIGTERM)  # signal of an ended job: quiet
    gone = {**h, "job_id": "999999999", "name": "onepool-nobody-a1"}
    assert other.status(gone).state == RankState.LOST  # no source remembers it
    other.signal(gone, signal.SIGKILL)
    assert POOL in other.pools.clusters

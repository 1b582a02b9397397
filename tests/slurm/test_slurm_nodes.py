"""SlurmPools.sync: what a Slurm pool's nodes hold, when Slurm changes between the reads of one
sync (no Slurm needed: a cluster whose job ends at a chosen read)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import select

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.slurm_pools import SlurmPools, job_name
from broker.spec import parse_config
from broker.state.model import Node
from providers.slurm import SlurmCluster
from providers.slurm.parse import Gres, SlurmJob, SlurmNode
from tests.conftest import config
from tests.slurm.conftest import POOL, slurm_pool


class EndsDuringSync(SlurmCluster):
    """One node `n1` with 4 GPUs; our job holds 2 of them and ends (FAILED, GPUs released) just
    after read number `ends_after` of this sync (0: before any read; 1: between the two)."""

    def __init__(self, job: str, ends_after: int) -> None:
        self.job, self.ends_after, self.reads = job, ends_after, 0

    def _read(self) -> bool:
        ended = self.reads >= self.ends_after
        self.reads += 1
        return ended

    def nodes(self) -> list[SlurmNode]:
        used = () if self._read() else (Gres("gpu", "a100", 2),)
        return [SlurmNode("n1", "mixed" if used else "idle", (Gres("gpu", "a100", 4),), used)]

    def jobs(self) -> list[SlurmJob]:
        state = "FAILED" if self._read() else "RUNNING"
        return [SlurmJob("7", self.job, state, "", ("n1",), (Gres("gpu", "a100", 2),), 0, "")]


@pytest.mark.parametrize("ends_after", [0, 1, 2])
def test_our_job_ending_mid_sync_never_shows_its_gpus_as_held_elsewhere(tmp_path: Path, clock: FakeClock,
                                                                          ends_after: int):
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config(pools=[slurm_pool()])))
    pools = SlurmPools(c.store, clock)
    pools.clusters[POOL] = EndsDuringSync(job_name(pools.broker, 1), ends_after)
    pools.sync(clock.now())
    with c.store.session() as s:
        (node,) = s.exec(select(Node).where(Node.pool == POOL)).all()
    assert (node.gpus, node.held_elsewhere) == (4, 0)

"""When Slurm cannot be reached or says no: clear errors that say what to do, nothing new
placed on the pool, nothing lost."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from sqlmodel import select

from broker.state.model import Node
from providers.base import Fatal, Transient
from providers.slurm import LocalRunner, SlurmCluster, SlurmRejected, SlurmUnreachable, SshRunner
from tests.conftest import drive
from tests.slurm.conftest import POOL, slurm_pool


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("runner, says", [
    (LocalRunner(env={"PATH": "/nonexistent"}), "`sinfo` is not installed on this machine"),
    (SshRunner("nobody@127.0.0.1", [f"Port={closed_port()}", "StrictHostKeyChecking=no"], timeout_s=5),
     "ssh to nobody@127.0.0.1 failed"),
])
def test_unreachable_slurm_is_transient_and_says_where(runner, says):
    with pytest.raises(SlurmUnreachable, match=says) as e:
        SlurmCluster(runner, "onepool").nodes()
    assert isinstance(e.value, Transient)


def test_a_command_that_does_not_answer_times_out():
    with pytest.raises(SlurmUnreachable, match=r"did not answer in 0\.5s"):
        LocalRunner(timeout_s=0.5).run([sys.executable, "-c", "import time; time.sleep(5)"])


def test_slurm_saying_no_is_fatal_with_its_message(slurm_node):
    cluster = SlurmCluster(LocalRunner(), "no-such-partition")
    with pytest.raises(SlurmRejected, match="invalid partition") as e:
        cluster.submit("#!/bin/bash\n#SBATCH -p no-such-partition\ntrue\n", "/tmp")
    assert isinstance(e.value, Fatal)
    assert cluster.record("999999999") is None  # a job Slurm never had
    cluster.cancel("999999999")  # cancelling a gone job is quiet


def test_unreachable_pool_takes_no_work_and_says_so(slurm_site):
    c, eng = slurm_site()
    eng.slurm.clusters[POOL] = SlurmCluster(LocalRunner(env={"PATH": "/nonexistent"}), "onepool")
    j = c.submit(name="waits", team="research", command=["true"], gpus_per_node=1).id
    for _ in range(3):
        eng.cycle()
    assert c.get(j).status == "PENDING" and c.get(j).attempts == 0
    events = [e for e in c.events() if e.kind == "slurm_unreachable"]
    assert len(events) == 1 and "`squeue` is not installed" in events[0].message


def test_a_submission_slurm_rejects_goes_back_to_the_queue_and_closes_the_pool(slurm_site):
    # 64 CPUs per GPU: more than the test node has, so sbatch refuses the job
    c, eng = slurm_site(pools=[slurm_pool(slurm={"cpus_per_gpu": 64})])
    j = c.submit(name="too-big", team="research", command=["true"], gpus_per_node=1).id
    drive(eng, lambda: c.get(j).attempts == 1 and c.get(j).status == "PENDING", timeout=30)
    a = c.get(j).attempt_list[0]
    assert (a.end_reason, a.cause) == ("INTERRUPTED", "slurm_rejected")
    (ev,) = [e for e in c.events(j) if e.kind == "slurm_rejected"]
    assert "Requested node configuration is not available" in ev.message
    eng.cycle()
    with c.store.session() as s:
        assert {n.state for n in s.exec(select(Node).where(Node.pool == POOL))} == {"unavailable"}
    assert c.get(j).attempts == 1  # not placed again while the pool is closed


def test_a_drained_node_takes_no_new_work_until_it_is_resumed(slurm_site, slurm_node):
    c, eng = slurm_site()
    eng.cycle()
    subprocess.run(["scontrol", "update", f"nodename={slurm_node}", "state=drain", "reason=onepool test"],
                   check=True)
    try:
        j = c.submit(name="waits", team="research", command=["true"], gpus_per_node=1).id
        eng.cycle()
        eng.cycle()
        with c.store.session() as s:
            node = s.get(Node, f"{POOL}-{slurm_node}")
            assert node is not None and node.state == "unavailable"
        assert c.get(j).status == "PENDING" and c.get(j).attempts == 0
        (ev,) = [e for e in c.events() if e.kind == "slurm_node" and e.data["state"] == "unavailable"]
        assert "Slurm state drain" in ev.message  # drained, or draining while a job still ends there
    finally:
        subprocess.run(["scontrol", "update", f"nodename={slurm_node}", "state=resume"], check=True)
    drive(eng, lambda: c.get(j).status == "SUCCEEDED", timeout=30)

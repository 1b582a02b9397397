"""A Slurm pool whose commands run over SSH on a login node (here: an sshd on 127.0.0.1)."""

from __future__ import annotations

import json
import sys

from tests.conftest import drive
from tests.slurm.conftest import POOL, slurm_pool
from tests.slurm.test_slurm_e2e import ENV_DUMP, rank_log


def test_a_job_runs_through_slurm_over_ssh(slurm_site, sshd, tmp_path):
    port, key = sshd
    opts = [f"Port={port}", f"IdentityFile={key}", "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]
    runs = tmp_path / "home" / "runs"  # the "cluster's" filesystem is this machine's
    c, eng = slurm_site(pools=[slurm_pool(slurm={"login": "root@127.0.0.1", "ssh_options": opts,
                                                 "output_dir": str(runs)})])
    cluster = eng.slurm.cluster(POOL)
    assert cluster.where == "root@127.0.0.1" and cluster.runner.base[0] == "ssh"
    j = c.submit(name="env", team="research", command=[sys.executable, "-c", ENV_DUMP], gpus_per_node=1).id
    drive(eng, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"), timeout=60)
    assert c.get(j).status == "SUCCEEDED", c.events(j)
    a = c.get(j).attempt_list[0]
    env = json.loads(rank_log(c, a.id).split("ENV ", 1)[1].splitlines()[0])
    assert env["ONEPOOL_JOB_ID"] == str(j) and env["ONEPOOL_PROVIDER"] == "slurm"
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    cluster.runner.close()  # no ssh master left behind

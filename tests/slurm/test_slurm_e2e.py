"""onepool over a real Slurm: jobs run as sbatch allocations, preemption both ways, restarts."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from tests.conftest import drive, train
from tests.slurm.conftest import POOL


def test_a_job_runs_through_slurm(slurm_site, tmp_path: Path):
    c, eng = slurm_site()
    done = tmp_path / "done"
    t0 = time.monotonic()
    jid = c.submit(name="small", team="research", command=train(8, step_s=0.05, done_file=done),
                   gpus_per_node=2).id
    drive(eng, lambda: c.get(jid).status in ("SUCCEEDED", "FAILED"), timeout=60)
    print("submit to done", time.monotonic() - t0)
    info = c.get(jid)
    assert info.status == "SUCCEEDED", c.events(jid)
    a = info.attempt_list[0]
    assert a.pool == POOL
    lines = [json.loads(x) for x in done.read_text().splitlines()]
    assert lines == [{"job": str(jid), "loss": lines[0]["loss"]}]

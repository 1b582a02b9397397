"""A multi-node job on Slurm: ONE allocation, one onepool rank per node (srun), a checkpoint
shard per rank; preempted, it resumes with every rank's shard."""

from __future__ import annotations

import json
import subprocess
import sys

from sqlmodel import select

from broker.checkpoint.checkpoints import CheckpointStore, step_name
from broker.state.model import Attempt
from tests.conftest import drive, train
from tests.slurm.conftest import GANG_POOL, slurm_pool
from tests.slurm.test_slurm_e2e import ENV_DUMP, rank_log


def test_gang_job_is_one_allocation_with_a_rank_per_node_and_resumes_with_every_shard(slurm_site, two_nodes):
    # grace 5 s: the example's ranks do not train in lockstep, so on SIGTERM they may save
    # different steps; rank 0 then waits out the grace for the other shard and the job resumes
    # from the newest step both ranks saved (a real gang's collectives keep ranks in step)
    c, eng = slurm_site(pools=[slurm_pool(name=GANG_POOL, nodes=2, slurm={"partition": "gang"})], grace_s=5)
    env = c.submit(name="env", team="research", command=[sys.executable, "-c", ENV_DUMP],
                   gpus_per_node=2, nodes=2).id
    drive(eng, lambda: c.get(env).status in ("SUCCEEDED", "FAILED"), timeout=60)
    assert c.get(env).status == "SUCCEEDED"
    a = c.get(env).attempt_list[0]
    envs = [json.loads(rank_log(c, a.id, r).split("ENV ", 1)[1].splitlines()[0]) for r in (0, 1)]
    assert [e["ONEPOOL_RANK"] for e in envs] == ["0", "1"]
    assert {e["ONEPOOL_WORLD_SIZE"] for e in envs} == {"2"}
    assert len({e["SLURM_JOB_ID"] for e in envs}) == 1  # one Slurm allocation for both ranks
    assert [len(e["CUDA_VISIBLE_DEVICES"].split(",")) for e in envs] == [2, 2]
    assert sorted(n for n, _ in a.alloc) == sorted(f"{GANG_POOL}-{n}" for n in two_nodes[:2])
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", envs[0]["SLURM_JOB_ID"], "-o", "%D"],
                         capture_output=True, text=True).stdout.strip()
    assert out == "2"  # both nodes in that one job

    gang = c.submit(name="gang", team="research", command=train(120, ckpt_every=5), gpus_per_node=2,
                    nodes=2, priority="low").id
    drive(eng, lambda: (c.get(gang).last_step or -1) >= 5, timeout=60)
    urgent = c.submit(name="urgent", team="prod", command=train(4), gpus_per_node=4, priority="urgent").id
    drive(eng, lambda: c.get(gang).status == "PENDING", timeout=60)
    first = c.get(gang).attempt_list[0]
    assert first.end_reason == "PREEMPTED" and first.preempted_by == urgent
    k = first.reached_step
    assert k is not None
    for r in (0, 1):
        assert "preempted: saved step" in rank_log(c, first.id, r)
    store = CheckpointStore(c.get(gang).checkpoint_uri)
    manifest = json.loads(store.fs.cat_file(f"{store.root}/{step_name(k)}/manifest.json"))
    assert manifest["world_size"] == 2
    assert store.fs.exists(f"{store.root}/{step_name(k)}/rank-00001/arrays.npz")
    drive(eng, lambda: c.get(gang).status == "SUCCEEDED" and c.get(urgent).status == "SUCCEEDED", timeout=120)
    info = c.get(gang)
    assert [x.end_reason for x in info.attempt_list] == ["PREEMPTED", "COMPLETED"], (
        [(x.end_reason, x.preempted_by, x.cause) for x in info.attempt_list],
        [(e.job_id, e.kind, e.message) for e in c.events() if e.job_id in (gang, urgent)])
    second = info.attempt_list[1]
    assert second.restored_step == k
    for r in (0, 1):
        assert f"resumed from step {k} (attempt 2)" in rank_log(c, second.id, r)
    with c.store.session() as s:
        rows = s.exec(select(Attempt).where(Attempt.job_id == gang)).all()
    assert all(len({h["job_id"] for h in row.handles}) == 1 for row in rows)  # ranks share one job

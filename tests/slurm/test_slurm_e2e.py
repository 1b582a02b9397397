"""onepool over a real Slurm (tests/slurm/start_slurm.sh): attempts run as sbatch allocations,
onepool preempts through scancel, Slurm's own preemption is an interruption, and a restarted
broker adopts what runs. Real processes, real checkpoints, the engine on a fake clock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import select

from broker.control.engine import Engine
from broker.control.snapshots import build_snapshot
from broker.state.model import Attempt, LedgerEntry, Node
from tests.conftest import drive, train
from tests.slurm.conftest import POOL

ENV_DUMP = """
import json, os
keys = ["ONEPOOL_JOB_ID", "ONEPOOL_ATTEMPT", "ONEPOOL_ATTEMPT_ID", "ONEPOOL_RANK", "ONEPOOL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES", "ONEPOOL_POOL", "ONEPOOL_PROVIDER", "ONEPOOL_GPU_TYPE",
        "ONEPOOL_CHECKPOINT_URI", "ONEPOOL_GRACE_S", "MY_VAR", "SLURM_JOB_ID"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
"""


def rank_log(c, attempt_id: int, rank: int = 0) -> str:
    p = c.store.home / "runs" / f"attempt-{attempt_id}" / f"rank-{rank}" / "output.log"
    return p.read_text() if p.exists() else ""


def slurm_jobs_named(name: str) -> list[str]:
    out = subprocess.run(["squeue", "--me", "-h", "-t", "all", "--name", name, "-o", "%i %T"],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def handle(c, job_id: int, number: int = 1) -> dict:
    with c.store.session() as s:
        a = s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)).one()
        return dict(a.handles[0])


def test_a_job_runs_through_slurm_with_the_onepool_environment(slurm_site, tmp_path: Path):
    c, eng = slurm_site()
    envj = c.submit(name="env", team="research", command=[sys.executable, "-c", ENV_DUMP],
                    gpus_per_node=2, env={"MY_VAR": "it's $HOME"}).id
    done = tmp_path / "done"
    trainj = c.submit(name="small", team="research", command=train(8, done_file=done), gpus_per_node=2).id
    drive(eng, lambda: {c.get(j).status for j in (envj, trainj)} <= {"SUCCEEDED", "FAILED"}, timeout=60,
          advance=1.0)
    assert c.get(envj).status == "SUCCEEDED" and c.get(trainj).status == "SUCCEEDED", c.events(trainj)
    a = c.get(envj).attempt_list[0]
    (slurm_name,) = [n.name for n in eng.slurm.cluster(POOL).nodes()]
    assert a.pool == POOL and a.alloc[0][0] == f"{POOL}-{slurm_name}"
    env = json.loads(rank_log(c, a.id).split("ENV ", 1)[1].splitlines()[0])
    assert env["ONEPOOL_RANK"] == "0" and env["ONEPOOL_WORLD_SIZE"] == "1"
    assert env["ONEPOOL_JOB_ID"] == str(envj) and env["ONEPOOL_ATTEMPT"] == "1"
    assert env["ONEPOOL_ATTEMPT_ID"] == str(a.id)
    assert (env["ONEPOOL_POOL"], env["ONEPOOL_PROVIDER"], env["ONEPOOL_GPU_TYPE"]) == (POOL, "slurm", "A100")
    assert env["MY_VAR"] == "it's $HOME" and env["ONEPOOL_GRACE_S"] == "30"
    # the GPUs are the ones Slurm allocated (two of the node's four), not onepool's slot numbers
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    assert set(env["CUDA_VISIBLE_DEVICES"].split(",")) <= {"0", "1", "2", "3"}
    assert env["SLURM_JOB_ID"] == handle(c, envj)["job_id"]
    assert env["ONEPOOL_CHECKPOINT_URI"].startswith("file://")
    lines = [json.loads(x) for x in done.read_text().splitlines()]
    assert [x["job"] for x in lines] == [str(trainj)]
    # The ledger charges onepool's GPU-seconds at the amortized rate, and not the GPUs it did
    # not hold (other Slurm users may hold them): no idle rows for a Slurm pool.
    with c.store.session() as s:
        rows = s.exec(select(LedgerEntry).where(LedgerEntry.pool == POOL,
                                                LedgerEntry.kind != "storage")).all()  # checkpoints: apart
        attempts = {a.id: a for a in s.exec(select(Attempt)).all()}
    assert rows and {r.kind for r in rows} == {"gpu"}
    for jid in (envj, trainj):
        a = next(x for x in attempts.values() if x.job_id == jid)
        mine = [r for r in rows if r.attempt_id == a.id]
        assert sum(r.end - r.start for r in mine) == pytest.approx(a.ended_at - a.started_at)
        assert sum(r.usd for r in mine) == pytest.approx(2 * (a.ended_at - a.started_at) * 1.5 / 3600)

def test_urgent_onepool_job_preempts_a_low_one_which_checkpoints_and_resumes(slurm_site):
    c, eng = slurm_site()
    low = c.submit(name="low", team="research", command=train(200, ckpt_every=5), gpus_per_node=4,
                   priority="low").id
    drive(eng, lambda: (c.get(low).last_step or -1) >= 5, timeout=60)
    first_slurm_job = handle(c, low)["job_id"]
    urgent = c.submit(name="urgent", team="prod", command=train(6), gpus_per_node=2,
                      priority="urgent").id
    drive(eng, lambda: c.get(low).status == "PENDING", timeout=60)
    first = c.get(low).attempt_list[0]
    assert first.end_reason == "PREEMPTED" and first.preempted_by == urgent
    assert "preempted: saved step" in rank_log(c, first.id)  # it got SIGTERM through scancel
    k = first.reached_step
    assert k is not None and k >= 5
    drive(eng, lambda: c.get(low).status == "SUCCEEDED" and c.get(urgent).status == "SUCCEEDED",
          timeout=120)
    info = c.get(low)
    assert [a.end_reason for a in info.attempt_list] == ["PREEMPTED", "COMPLETED"]
    second = info.attempt_list[1]
    assert second.restored_step == k
    assert f"resumed from step {k} (attempt 2)" in rank_log(c, second.id)
    assert handle(c, low, 2)["job_id"] != first_slurm_job  # each attempt is its own Slurm job
    kinds = [e.kind for e in c.events(low)]
    assert "preempting" in kinds and kinds[-1] == "succeeded"


def held_elsewhere(c) -> int:
    with c.store.session() as s:
        return s.exec(select(Node).where(Node.pool == POOL)).one().held_elsewhere


def test_slurm_side_preemption_is_an_interruption_and_the_job_resumes(slurm_site, clock):
    c, eng = slurm_site()
    j = c.submit(name="victim", team="research", command=train(200, ckpt_every=5), gpus_per_node=4).id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 5, timeout=60)
    # another Slurm user's job in a higher-priority partition, submitted straight to Slurm
    other = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--gres=gpu:a100:4", "-J", "not-onepool",
                            "-o", "/dev/null", "--wrap", "sleep 4"],
                           capture_output=True, text=True, check=True).stdout.strip()
    drive(eng, lambda: c.get(j).attempt_list[0].end_reason is not None, timeout=60)
    first = c.get(j).attempt_list[0]
    assert first.end_reason == "INTERRUPTED" and first.cause == "slurm_preempted"
    assert c.get(j).status == "PENDING"  # not resubmitted into the GPUs Slurm took
    assert "preempted: saved step" in rank_log(c, first.id)  # Slurm's SIGTERM reached the rank
    # While the other user's job holds all four GPUs, they are not free to onepool.
    drive(eng, lambda: held_elsewhere(c) == 4, timeout=30)
    with c.store.session() as s:
        snap = build_snapshot(s, clock.now(), eng.policy, 3600.0)
    (pool,) = [p for p in snap.pools if p.name == POOL]
    ours = sum(g for r in snap.running for node, g in r.alloc if node == pool.nodes[0].id)
    assert pool.nodes[0].gpus - ours == 0
    drive(eng, lambda: c.get(j).status == "SUCCEEDED", timeout=120)
    info = c.get(j)
    assert [a.end_reason for a in info.attempt_list] == ["INTERRUPTED", "COMPLETED"]
    assert info.attempt_list[1].restored_step == first.reached_step
    assert info.preemptions == 0  # not charged to any onepool job
    rec = subprocess.run(["scontrol", "-o", "show", "job", other], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in rec
    kinds = [e.kind for e in c.events(j)]
    assert "interrupted" in kinds and kinds[-1] == "succeeded"


def test_a_restarted_broker_adopts_running_slurm_attempts_without_running_twice(slurm_site, clock, tmp_path):
    c, eng = slurm_site()
    done = tmp_path / "done"
    j = c.submit(name="once", team="research", command=train(60, ckpt_every=5, done_file=done),
                 gpus_per_node=1).id
    drive(eng, lambda: c.get(j).attempts == 1)  # submitted to Slurm (once its GPUs are free) ...
    h = handle(c, j)
    with c.store.session() as s:  # ... and the broker died before it wrote the handle down
        a = s.exec(select(Attempt).where(Attempt.job_id == j)).one()
        a.handles, a.state = [], "LAUNCHING"
        s.add(a)
    lease_s = eng.settings.lease_s
    del eng
    clock.advance(lease_s + 1)  # the dead broker's lease runs out
    second = Engine(c.store, clock)
    second.reconcile()  # finds the job by its name instead of submitting another
    assert handle(c, j)["job_id"] == h["job_id"]
    drive(second, lambda: (c.get(j).last_step or -1) >= 5, timeout=60)
    del second  # killed again while the attempt runs
    clock.advance(lease_s + 1)
    third = Engine(c.store, clock)
    third.reconcile()
    drive(third, lambda: c.get(j).status == "SUCCEEDED", timeout=60)
    info = c.get(j)
    assert info.attempts == 1 and info.attempt_list[0].end_reason == "COMPLETED"
    assert len(slurm_jobs_named(h["name"])) == 1
    assert rank_log(c, info.attempt_list[0].id).count("fresh start") == 1
    assert len(done.read_text().splitlines()) == 1
    assert [e.kind for e in c.events(j)].count("reconciled") == 1

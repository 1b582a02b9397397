"""The engine with real processes and an injected (fake) clock."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlmodel import select

from broker.checkpoint.checkpoints import CheckpointStore, step_name
from broker.control.engine import Engine
from broker.state.model import Attempt, Checkpoint
from providers.local import LocalProcesses
from tests.conftest import drive, train

pytestmark = pytest.mark.both_dbs


def out_log(c: Any, attempt_id: int, rank: int = 0) -> str:
    return (c.store.home / "runs" / f"attempt-{attempt_id}" / f"rank-{rank}" /
            "output.log").read_text()


def test_victim_resumes_from_last_checkpoint_and_ignores_a_torn_one(make_cluster):
    c, eng = make_cluster()
    low = c.submit(name="low", team="research", command=train(30), gpus_per_node=2,
                   priority="low").id
    drive(eng, lambda: (c.get(low).last_step or -1) >= 5)
    urgent = c.submit(name="urgent", team="prod", command=train(6), gpus_per_node=2,
                      priority="urgent").id
    drive(eng, lambda: c.get(low).status == "PENDING")
    first = c.get(low).attempt_list[0]
    assert first.end_reason == "PREEMPTED" and first.preempted_by == urgent
    k = first.reached_step
    assert k is not None and k >= 5
    # A torn checkpoint (files, no manifest) newer than k must never be resumed from.
    torn = CheckpointStore(c.get(low).checkpoint_uri)
    torn.fs.makedirs(f"{torn.root}/{step_name(k + 3)}", exist_ok=True)
    torn.fs.pipe_file(f"{torn.root}/{step_name(k + 3)}/arrays.npz", b"garbage")
    drive(eng, lambda: c.get(low).status == "SUCCEEDED" and c.get(urgent).status == "SUCCEEDED")
    info = c.get(low)
    assert [a.end_reason for a in info.attempt_list] == ["PREEMPTED", "COMPLETED"]
    second = info.attempt_list[1]
    assert second.restored_step == k
    assert f"resumed from step {k} (attempt 2)" in out_log(c, second.id)
    assert info.preemptions == 1 and info.last_step == 29
    with c.store.session() as s:
        rows = s.exec(select(Checkpoint).where(Checkpoint.job_id == low,
                                               Checkpoint.state == "committed")).all()
    by_attempt = {r.step: r.attempt_id for r in rows}
    assert all(by_attempt[st] == first.id for st in by_attempt if st <= k)
    assert all(by_attempt[st] == second.id for st in by_attempt if st > k)
    kinds = [e.kind for e in c.events(low)]
    assert kinds[:2] == ["submitted", "started"] and "preempting" in kinds
    assert kinds[-1] == "succeeded"


STUBBORN = """
import os, signal, sys, time
from broker import runtime
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):  # the test says when to checkpoint
    time.sleep(0.01)
runtime.save(0, files={"x": b"x"})
print("saved; ignoring SIGTERM", flush=True)
while True:
    time.sleep(0.05)
"""


def test_lost_work_and_grace_kill_match_hand_computation(make_cluster, clock, tmp_path):
    """Start t0; checkpoint first seen t0+10; preempt at t0+60; SIGTERM ignored; killed at
    t0+90 (grace 30): lost = (90 - 10) s x 2 GPUs = 160 GPU-s."""
    c, eng = make_cluster(grace_s=30)
    t0 = clock.now()
    go = tmp_path / "go"
    j = c.submit(name="stubborn", team="research",
                 command=[sys.executable, "-c", STUBBORN, str(go)],
                 gpus_per_node=2, priority="low").id
    eng.cycle()
    aid = c.get(j).attempt_list[0].id
    drive(eng, lambda: "ready" in out_log(c, aid))
    clock.advance(10)
    go.touch()
    drive(eng, lambda: c.get(j).last_step == 0)
    clock.advance(50)
    u = c.submit(name="u", team="prod", command=train(2), gpus_per_node=2, priority="urgent").id
    rep = eng.cycle()
    assert rep.preempted == [j]
    clock.advance(29)
    assert eng.cycle().killed == []  # still inside its grace period
    clock.advance(1)
    assert eng.cycle().killed == [j]
    drive(eng, lambda: c.get(j).status == "PENDING")
    a = c.get(j).attempt_list[0]
    assert a.end_reason == "PREEMPTED"
    assert a.started_at == t0 and a.ended_at == t0 + 90
    assert a.lost_gpu_s == pytest.approx(160.0)
    assert [e.kind for e in c.events(j)].count("killed") == 1
    c.cancel(j)
    drive(eng, lambda: c.get(u).status == "SUCCEEDED" and c.get(j).status == "CANCELLED")


def test_failing_job_fails_without_requeue(make_cluster):
    c, eng = make_cluster()
    j = c.submit(name="bad", team="research", command=[sys.executable, "-c", "raise SystemExit(3)"]).id
    drive(eng, lambda: c.get(j).status == "FAILED")
    info = c.get(j)
    assert info.attempts == 1 and info.attempt_list[0].exit_code == 3


def test_missing_command_fails_with_127(make_cluster):
    c, eng = make_cluster()
    j = c.submit(name="nope", team="research", command=["/nonexistent/binary"]).id
    drive(eng, lambda: c.get(j).status == "FAILED")
    assert c.get(j).attempt_list[0].exit_code == 127


def test_cancel_pending_and_running(make_cluster):
    c, eng = make_cluster()
    run = c.submit(name="r", team="research", command=train(200), gpus_per_node=2).id
    wait = c.submit(name="w", team="research", command=train(2), gpus_per_node=2).id
    drive(eng, lambda: c.get(run).status == "RUNNING")
    c.cancel(wait)
    c.cancel(run)
    drive(eng, lambda: c.get(run).status == "CANCELLED" and c.get(wait).status == "CANCELLED")
    assert c.get(wait).attempts == 0
    assert c.get(run).attempt_list[0].end_reason == "CANCELLED"


ENV_DUMP = """
import json, os
keys = ["ONEPOOL_JOB_ID", "ONEPOOL_ATTEMPT", "ONEPOOL_RANK", "ONEPOOL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES", "ONEPOOL_GPU_TYPE", "ONEPOOL_POOL", "MY_VAR"]
print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
"""


def test_gang_job_runs_one_rank_per_node_with_its_gpu_slots(make_cluster):
    pools = [{"name": "small", "gpu_type": "L4", "gpus_per_node": 4, "nodes": 1},
             {"name": "big", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 2}]
    c, eng = make_cluster(pools=pools)
    filler = c.submit(name="f", team="research", command=train(300), gpus_per_node=1,
                      gpu_types=["A100"]).id
    drive(eng, lambda: c.get(filler).status == "RUNNING")
    g = c.submit(name="g", team="research", command=[sys.executable, "-c", ENV_DUMP],
                 gpus_per_node=3, nodes=2, gpu_types=["A100"], env={"MY_VAR": "hi"}).id
    drive(eng, lambda: c.get(g).status == "SUCCEEDED")
    a = c.get(g).attempt_list[0]
    assert a.pool == "big" and len(a.alloc) == 2
    envs = [json.loads(out_log(c, a.id, r).strip()) for r in (0, 1)]
    assert [e["ONEPOOL_RANK"] for e in envs] == ["0", "1"]
    assert {e["ONEPOOL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MY_VAR"] for e in envs} == {"hi"} and {e["ONEPOOL_GPU_TYPE"] for e in envs} == {"A100"}
    slots = dict((node, s) for node, s in a.alloc)
    filler_node = c.get(filler).attempt_list[0].alloc[0][0]
    assert slots[filler_node] == [1, 2, 3]  # slot 0 is the filler's
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [
        ",".join(map(str, s)) for _, s in a.alloc]
    c.cancel(filler)
    drive(eng, lambda: c.get(filler).status == "CANCELLED")


class CrashAfterStart(LocalProcesses):
    """Starts the process, then 'crashes' the broker before the DB records the handle."""

    def start(self, *a: Any, **kw: Any) -> dict:
        super().start(*a, **kw)
        raise KeyboardInterrupt("simulated broker crash")


def test_crash_between_launch_and_db_write_starts_the_job_once(make_cluster, clock):
    c, first = make_cluster()
    first.close()  # gives the lease back
    j = c.submit(name="once", team="research", command=train(10)).id
    crashing = Engine(c.store, clock, CrashAfterStart(c.store.home / "runs"))
    with pytest.raises(KeyboardInterrupt):
        crashing.cycle()
    with c.store.session() as s:
        a = s.exec(select(Attempt).where(Attempt.job_id == j)).one()
        assert a.state == "LAUNCHING" and a.handles == []
    clock.advance(crashing.settings.lease_s)  # the crashed broker's lease runs out
    fresh = Engine(c.store, clock)
    fresh.reconcile()
    drive(fresh, lambda: c.get(j).status == "SUCCEEDED")
    info = c.get(j)
    assert info.attempts == 1
    assert out_log(c, info.attempt_list[0].id).count("fresh start") == 1
    assert [e.kind for e in c.events(j)].count("reconciled") == 1


def test_vanished_process_is_requeued_and_resumes(make_cluster):
    c, eng = make_cluster()
    j = c.submit(name="v", team="research", command=train(100)).id  # outlives the lookup
    drive(eng, lambda: (c.get(j).last_step or -1) >= 3)
    a = c.get(j).attempt_list[0]
    handle = json.loads(Path(a.alloc and c.store.home / "runs" / f"attempt-{a.id}" / "rank-0"
                             / "handle.json").read_text())
    group = [psutil.Process(handle["pid"]), *psutil.Process(handle["pid"]).children(recursive=True)]
    os.killpg(handle["pid"], signal.SIGKILL)  # a node failure: no exit status is written
    psutil.wait_procs(group, timeout=10)  # everything died at once, as with the node
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    info = c.get(j)
    assert [x.end_reason for x in info.attempt_list] == ["LOST", "COMPLETED"]
    assert [x.cause for x in info.attempt_list] == ["node_failure", None]
    assert info.attempt_list[1].restored_step == info.attempt_list[0].reached_step
    assert info.preemptions == 0


def test_status_shows_progress_and_an_eta_for_a_job_that_reports_its_total(make_cluster, monkeypatch):
    """broker.runtime.progress(step, total): the broker reads the marker, `status` shows the step,
    the total and an ETA from the job's own rate; a job's waiting reason goes when it runs."""
    monkeypatch.setenv("ONEPOOL_PROGRESS_EVERY_S", "0.1")  # inherited by the job processes
    c, eng = make_cluster()
    j = c.submit(name="long", team="research", command=train(2000, step_s=0.02, ckpt_every=5),
                 gpus_per_node=2).id
    # The broker reads the marker on each new checkpoint, else every PROGRESS_READ_S of its clock.
    drive(eng, lambda: (c.get(j).progress_step or 0) >= 5 and c.get(j).eta is not None, advance=1.0)
    info = c.get(j)
    a = info.attempt_list[-1]
    assert info.status == "RUNNING" and info.progress_total == 2000
    assert a.progress_rate is not None and 0 < a.progress_rate <= 1 / 0.02
    left = 1999 - (info.progress_step or 0)
    assert info.eta == pytest.approx((a.progress_at or 0) + left / a.progress_rate)
    assert info.waiting_reason is None
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    assert c.get(j).eta is None  # nothing to wait for once it ended

"""Failures stay contained: a poison job ends only its own attempt; no process outlives its
attempt, even when its supervisor is killed; no new attempt starts beside an old one."""

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

from broker.control.engine import Engine
from broker.state.model import Attempt, Job
from tests.conftest import drive, train
from tests.test_engine_e2e import CrashAfterStart, out_log

pytestmark = pytest.mark.both_dbs


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def corrupt_job(c: Any, job_id: int, **fields: Any) -> None:
    """Write fields of a job row directly, as a broken client or an old version might."""
    with c.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        for k, v in fields.items():
            setattr(job, k, v)
        s.add(job)


# -- poison inputs ------------------------------------------------------------------------------
def vanished_workdir(c: Any, tmp_path: Path) -> tuple[int, str]:
    wd = tmp_path / "gone"
    wd.mkdir()
    j = c.submit(name="poison", team="research", command=train(2), workdir=str(wd)).id
    wd.rmdir()  # deleted after the submit
    return j, "does not exist"


def nul_in_command(c: Any, tmp_path: Path) -> tuple[int, str]:
    j = c.submit(name="poison", team="research", command=["true"]).id
    corrupt_job(c, j, command=["echo", "a\x00b"])
    return j, "null byte"


def nul_in_env(c: Any, tmp_path: Path) -> tuple[int, str]:
    j = c.submit(name="poison", team="research", command=["true"]).id
    corrupt_job(c, j, env={"X": "a\x00b"})
    return j, "null byte"


POISON = [vanished_workdir, nul_in_command, nul_in_env]


@pytest.mark.parametrize("poison", POISON, ids=[p.__name__ for p in POISON])
def test_a_poison_job_fails_alone_and_the_next_job_runs(make_cluster, tmp_path, db, poison):
    if db == "postgresql" and poison is not vanished_workdir:
        pytest.skip("PostgreSQL text cannot hold a NUL byte: such a row cannot exist there")
    c, eng = make_cluster()
    bad, reason = poison(c, tmp_path)
    good = c.submit(name="good", team="research", command=train(3)).id
    drive(eng, lambda: c.get(good).status == "SUCCEEDED" and c.get(bad).status == "FAILED")
    a = c.get(bad).attempt_list[0]
    assert a.cause in ("start_failed:workdir_missing", "start_failed:invalid_command") and a.exit_code is None
    [ev] = [e for e in c.events(bad) if e.kind == "start_failed"]
    assert reason in ev.message.lower()


def test_reconcile_finishes_healthy_launches_and_fails_only_the_poison_one(make_cluster, clock, tmp_path):
    """Both attempts are LAUNCHING when brokers die (one each); the next broker's reconcile
    starts the healthy one and fails the one whose working directory vanished."""
    c, first = make_cluster()
    first.close()
    bad, _ = vanished_workdir(c, tmp_path)
    good = c.submit(name="good", team="research", command=train(3)).id
    for _ in range(2):  # each crashing broker writes one LAUNCHING attempt, then dies
        crashing = Engine(c.store, clock, CrashBeforeStart(c.store.home / "runs"))
        with pytest.raises(KeyboardInterrupt):
            crashing.cycle()
        clock.advance(crashing.settings.lease_s)
    with c.store.session() as s:
        assert [a.state for a in s.exec(select(Attempt)).all()] == ["LAUNCHING", "LAUNCHING"]
    fresh = Engine(c.store, clock)
    fresh.reconcile()  # does not raise
    drive(fresh, lambda: c.get(good).status == "SUCCEEDED" and c.get(bad).status == "FAILED")
    assert [e.kind for e in c.events(good)].count("reconciled") == 1
    assert "start_failed" in [e.kind for e in c.events(bad)]
    fresh.close()


class CrashBeforeStart(CrashAfterStart):
    """The broker dies after writing LAUNCHING, before starting anything."""

    def start(self, *a: Any, **kw: Any) -> dict:
        raise KeyboardInterrupt("simulated broker crash")


def test_an_attempt_the_broker_cannot_poll_fails_alone(make_cluster):
    c, eng = make_cluster()
    bad = c.submit(name="bad", team="research", command=train(400), gpus_per_node=1).id
    drive(eng, lambda: c.get(bad).status == "RUNNING")
    aid = c.get(bad).attempt_list[0].id
    with c.store.session() as s:
        a = s.get(Attempt, aid)
        assert a is not None
        real, a.handles = a.handles[0], [{"corrupt": True}]  # status() raises on this handle
        s.add(a)
    good = c.submit(name="good", team="research", command=train(3), gpus_per_node=1).id
    drive(eng, lambda: c.get(good).status == "SUCCEEDED" and c.get(bad).status == "FAILED")
    assert c.get(bad).attempt_list[0].cause == "broker_error"
    assert "attempt_error" in [e.kind for e in c.events(bad)]
    eng.executor.kill(real)  # the broker could not find it through the corrupt handle


# -- process containment ------------------------------------------------------------------------
FAMILY = """
import fcntl, os, subprocess, sys, time
lock = open(sys.argv[1], "a")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    open(sys.argv[2], "a").write("duplicate\\n")  # another attempt's process holds the job
# A helper in a session of its own: outside the job's process group.
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True)
print(json.dumps({"main": os.getpid(), "helper": helper.pid}), flush=True)
while not os.path.exists(sys.argv[3]):
    time.sleep(0.02)
""".replace("import fcntl", "import json, fcntl")


def family(tmp_path: Path) -> tuple[list[str], Path, Path]:
    dup, go = tmp_path / "duplicates", tmp_path / "go"
    return [sys.executable, "-c", FAMILY, str(tmp_path / "job.lock"), str(dup), str(go)], dup, go


def pids_of(c: Any, attempt_id: int) -> dict[str, int]:
    text = out_log(c, attempt_id).strip().splitlines()
    return json.loads(next(line for line in text if line.startswith("{")))


@pytest.mark.parametrize("containment", ["cgroup", "group"])
def test_a_killed_supervisor_leaves_no_process_and_no_duplicate_attempt(make_cluster, tmp_path, containment):
    c, eng = make_cluster(containment=containment)
    cmd, dup, go = family(tmp_path)
    j = c.submit(name="fam", team="research", command=cmd).id
    drive(eng, lambda: c.get(j).status == "RUNNING" and "helper" in out_log(c, c.get(j).attempt_list[0].id))
    first = c.get(j).attempt_list[0]
    pids = pids_of(c, first.id)
    supervisor = json.loads((c.store.home / "runs" / f"attempt-{first.id}" / "rank-0" / "handle.json")
                            .read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)  # only the supervisor: its job and the helper live on
    drive(eng, lambda: len(c.get(j).attempt_list) == 2)
    assert dead(pids["main"]) and dead(pids["helper"])  # both killed before attempt 2 began
    a1 = c.get(j).attempt_list[0]
    assert a1.end_reason == "LOST" and a1.cause == "supervisor_lost"
    assert "orphans_killed" in [e.kind for e in c.events(j)]
    go.touch()
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert not dup.exists()  # the two attempts never ran at the same time
    assert dead(pids_of(c, c.get(j).attempt_list[1].id)["helper"])  # ended with its attempt


@pytest.mark.parametrize("containment", ["cgroup", "group"])
def test_what_a_job_leaves_behind_dies_with_its_attempt(make_cluster, tmp_path, containment):
    c, eng = make_cluster(containment=containment)
    cmd, _dup, go = family(tmp_path)
    go.touch()  # the main process exits at once, leaving its helper
    j = c.submit(name="fam", team="research", command=cmd).id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert dead(pids_of(c, c.get(j).attempt_list[0].id)["helper"])


def test_cancel_kills_a_helper_that_left_the_process_group(make_cluster, tmp_path):
    c, eng = make_cluster()
    cmd, _dup, _go = family(tmp_path)
    j = c.submit(name="fam", team="research", command=cmd).id
    drive(eng, lambda: c.get(j).status == "RUNNING" and "helper" in out_log(c, c.get(j).attempt_list[0].id))
    pids = pids_of(c, c.get(j).attempt_list[0].id)
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    assert dead(pids["main"]) and dead(pids["helper"])


def test_no_new_attempt_starts_while_a_process_of_the_previous_one_lives(make_cluster, tmp_path, clock):
    """An attempt ended (here by hand, as a lost node's attempts are) while its process still
    runs: the next launch kills it first and starts only once it is gone."""
    c, eng = make_cluster()
    cmd, dup, go = family(tmp_path)
    j = c.submit(name="fam", team="research", command=cmd).id
    drive(eng, lambda: c.get(j).status == "RUNNING" and "helper" in out_log(c, c.get(j).attempt_list[0].id))
    first = c.get(j).attempt_list[0]
    pids = pids_of(c, first.id)
    with c.store.session() as s:
        a = s.get(Attempt, first.id)
        job = s.get(Job, j)
        assert a is not None and job is not None
        a.state, a.end_reason, a.ended_at = "ENDED", "LOST", clock.now()
        job.state = "PENDING"
        s.add(a)
        s.add(job)
    drive(eng, lambda: len(c.get(j).attempt_list) == 2)
    assert dead(pids["main"]) and dead(pids["helper"])
    assert "previous_attempt_alive" in [e.kind for e in c.events(j)]
    go.touch()
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert not dup.exists()


DONE_THEN_SLOW = """
import time
from broker import runtime
print("results written", flush=True)
runtime.done()
time.sleep(600)  # a slow exit: the supervisor dies before it can record the exit code
"""


def test_a_job_that_declared_itself_done_is_not_run_again_when_its_supervisor_dies(make_cluster):
    c, eng = make_cluster()
    j = c.submit(name="done", team="research", command=[sys.executable, "-c", DONE_THEN_SLOW]).id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    aid = c.get(j).attempt_list[0].id
    rank = c.store.home / "runs" / f"attempt-{aid}" / "rank-0"
    marker = eng.executor.iso.job_dir(rank) / "done.json"  # type: ignore[attr-defined]  # the job's folder
    drive(eng, lambda: marker.exists())
    os.kill(json.loads((rank / "handle.json").read_text())["pid"], signal.SIGKILL)
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    info = c.get(j)
    assert info.attempts == 1 and info.attempt_list[0].end_reason == "COMPLETED"
    assert not (rank / "exit.json").exists()  # nobody recorded an exit code: done.json counted

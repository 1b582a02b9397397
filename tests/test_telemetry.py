"""The ledger of lost work with a fake clock: every number by hand, and what the CLI shows."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from broker.checkpoint.telemetry import cause_kind, cause_of
from broker.client.cli import app
from broker.state.model import Attempt, EndReason
from tests.conftest import drive
from tests.test_cross_store_e2e import gated
from tests.test_engine_e2e import out_log

pytestmark = pytest.mark.both_dbs

STEPPER = """
import sys, time
from pathlib import Path
from broker import runtime
gate = Path(sys.argv[1])
r = runtime.restore()
att = runtime.context().attempt
step = r.step + 1 if r else 0
print(f"ready attempt {att}", flush=True)

def wait_for(name):  # the test says when each thing happens
    while not (gate / f"{name}-{att}").exists():
        if runtime.preempted():
            runtime.exit_preempted()  # no save: the work since the last checkpoint is lost
        time.sleep(0.01)

wait_for("step")
runtime.progress(step)
wait_for("save")
runtime.save(step, files={"x": b"x" * 1000}, block=True)
print(f"saved {step}", flush=True)
wait_for("end")
"""


def test_lost_work_restart_overhead_and_attribution_match_hand_computation(make_cluster, clock, tmp_path):
    """t0 start; first step seen t0+5; checkpoint seen t0+10; preempted at t0+60 by the
    urgent job (team prod): lost (60-10) s x 2 GPUs = 100 GPU-s, charged to prod.
    Restart at t0+100 from the 1000-byte checkpoint; first new step seen t0+107: overhead 7 s."""
    c, eng = make_cluster()
    t0 = clock.now()
    j = c.submit(name="victim", team="research", command=[sys.executable, "-c", STEPPER, str(tmp_path)],
                 gpus_per_node=2, priority="low").id
    eng.cycle()
    a1 = c.get(j).attempt_list[0]
    drive(eng, lambda: "ready attempt 1" in out_log(c, a1.id))
    clock.advance(5)
    (tmp_path / "step-1").touch()
    drive(eng, lambda: c.get(j).attempt_list[0].restart_overhead_s is not None)
    clock.advance(5)
    (tmp_path / "save-1").touch()
    drive(eng, lambda: c.get(j).last_step == 0)
    clock.advance(50)
    go = tmp_path / "urgent-go"
    u = c.submit(name="urgent", team="prod", command=gated(go), gpus_per_node=2, priority="urgent").id
    drive(eng, lambda: c.get(j).status == "PENDING")
    clock.advance(40)
    go.touch()
    drive(eng, lambda: c.get(j).status == "RUNNING")
    a2 = c.get(j).attempt_list[1]
    drive(eng, lambda: "ready attempt 2" in out_log(c, a2.id))
    clock.advance(7)
    (tmp_path / "step-2").touch()
    drive(eng, lambda: c.get(j).attempt_list[1].restart_overhead_s is not None)
    clock.advance(3)
    (tmp_path / "save-2").touch()
    (tmp_path / "end-2").touch()
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")

    a1, a2 = c.get(j).attempt_list
    assert (a1.started_at, a1.ended_at) == (t0, t0 + 60)
    assert a1.restart_overhead_s == 5 and a1.lost_gpu_s == pytest.approx(100.0)
    assert a1.cause == f"preempted_by={u}" and a1.restore_bytes == 0
    assert (a2.started_at, a2.ended_at) == (t0 + 100, t0 + 110)
    assert a2.restored_step == 0 and a2.restore_bytes == 1000 and a2.egress_bytes == 0
    assert a2.restart_overhead_s == 7 and a2.lost_gpu_s == 0 and a2.cause is None
    assert c.get(j).lost_gpu_s == pytest.approx(100.0)
    assert c.get(u).caused_lost_gpu_s == pytest.approx(100.0)
    assert [(r.key, r.lost_gpu_s, r.victims) for r in c.lost_work("team")] == [("prod", 100.0, [j])]
    # the restart it forced: attempt 2's 7 s to its first new step x 2 GPUs
    assert [(r.key, r.restart_gpu_s) for r in c.lost_work("team")] == [("prod", 14.0)]
    assert [(r.key, r.restart_gpu_s) for r in c.lost_work("cause")] == [("preempted", 14.0)]
    assert [(r.key, r.lost_gpu_hours) for r in c.lost_work("job")] == [(str(u), 100.0 / 3600)]
    assert [(r.key, r.attempts) for r in c.lost_work("cause")] == [("preempted", 1)]
    caused = [e for e in c.events(u) if e.kind == "caused_loss"]
    assert len(caused) == 1 and caused[0].data["lost_gpu_s"] == pytest.approx(100.0)

    # What a user sees.
    home = str(c.store.home)
    run = CliRunner().invoke
    status = json.loads(run(app, ["--home", home, "status", str(j), "--json"]).stdout)
    assert [a["cause"] for a in status["attempt_list"]] == [f"preempted_by={u}", None]
    assert [a["restart_overhead_s"] for a in status["attempt_list"]] == [5.0, 7.0]
    assert status["bytes_restored"] == 1000 and status["checkpoint_stores"] == [c.checkpoint_root(c.config())]
    events = json.loads(run(app, ["--home", home, "events", str(j), "--json"]).stdout)
    pre = next(e for e in events if e["kind"] == "preempted")
    assert pre["data"]["cause"] == f"preempted_by={u}" and pre["data"]["lost_gpu_s"] == 100.0
    lost = json.loads(run(app, ["--home", home, "lost", "--by", "team", "--json"]).stdout)
    assert lost == [{"key": "prod", "lost_gpu_s": 100.0, "lost_gpu_hours": 100.0 / 3600,
                     "attempts": 1, "victims": [j], "restart_gpu_s": 14.0}]
    table = run(app, ["--home", home, "status", str(j)], env={"COLUMNS": "250"}).stdout
    assert "preempted_by=" in table and "checkpoints lived in" in table
    assert run(app, ["--home", home, "lost", "--by", "pool"]).exit_code != 0


ASKER = """
import time
from broker import runtime
print("ready", flush=True)
n = 0
while not runtime.preempted():
    if runtime.due():  # true once the broker asks (SIGUSR1); the interval hint is long
        runtime.save(n, files={"n": str(n).encode()}, block=True)
        print(f"saved {n} on request", flush=True)
        n += 1
    time.sleep(0.01)
runtime.exit_preempted()
"""


def test_checkpoint_now_request_is_honoured_and_the_job_keeps_running(make_cluster):
    c, eng = make_cluster()
    j = c.submit(name="asked", team="research", command=[sys.executable, "-c", ASKER],
                 gpus_per_node=1, checkpoint_interval_s=3600).id
    eng.cycle()
    aid = c.get(j).attempt_list[0].id
    drive(eng, lambda: "ready" in out_log(c, aid))
    assert c.get(j).last_step is None
    assert eng.request_checkpoint(aid, "test asks") is True
    drive(eng, lambda: c.get(j).last_step == 0)
    assert eng.request_checkpoint(aid, "again") is True
    drive(eng, lambda: c.get(j).last_step == 1)
    assert c.get(j).status == "RUNNING" and "saved 1 on request" in out_log(c, aid)
    assert [e.kind for e in c.events(j)].count("checkpoint_requested") == 2
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    assert c.get(j).attempt_list[0].cause == "cancelled"
    assert eng.request_checkpoint(aid, "too late") is False


@pytest.mark.parametrize(("reason", "stop", "cause", "preempted_by", "kind"), [
    (EndReason.COMPLETED, None, None, None, "completed"),
    (EndReason.PREEMPTED, "preempted", "preempted_by=9", 9, "preempted"),
    (EndReason.INTERRUPTED, "interrupted", "spot_interruption", None, "spot_interruption"),
    (EndReason.LOST, None, "node_failure", None, "node_failure"),
    (EndReason.CANCELLED, "cancelled", "cancelled", None, "cancelled"),
    (EndReason.FAILED, "budget", "budget", None, "budget"),
    (EndReason.FAILED, None, "failed", None, "failed"),
])
def test_causes(reason, stop, cause, preempted_by, kind):
    a = Attempt(job_id=1, number=1, pool="p", priority="low", started_at=0.0, stop_reason=stop,
                preempted_by=preempted_by)
    assert cause_of(a, reason) == cause
    assert cause_kind(cause) == kind

"""Kill the broker process with SIGKILL mid-run, restart it, and every job finishes once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.client.sdk import Client
from broker.spec import parse_config
from tests.conftest import ROOT, config, train

pytestmark = pytest.mark.both_dbs


def start_broker(home: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "broker.client.cli", "--home", str(home), "broker", "--cycle-s", "0.2"],
        cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def wait_for(cond, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Poll the database for a condition another process brings about (bounded)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_sigkill_broker_mid_run_every_job_finishes_exactly_once(tmp_path: Path) -> None:
    home, done = tmp_path / "home", tmp_path / "done.jsonl"
    c = Client(home)
    c.apply(parse_config(config(
        pools=[{"name": "a", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1},
               {"name": "b", "gpu_type": "L4", "gpus_per_node": 2, "nodes": 1}])))
    ids = [c.submit(name=f"j{i}", team="research", command=train(12, 0.1, 3, done),
                    gpus_per_node=1).id for i in range(7)]
    broker = start_broker(home, tmp_path / "broker.log")
    try:
        # Mid-run: some jobs done or running, others still queued.
        wait_for(lambda: sum(c.get(i).status == "RUNNING" for i in ids) == 4)
        broker.send_signal(signal.SIGKILL)
        broker.wait()
        # While no broker runs, the running jobs finish on their own.
        wait_for(lambda: len(done.read_text().splitlines()) >= 4 if done.exists() else False)
        broker = start_broker(home, tmp_path / "broker.log")
        infos = c.wait(ids, timeout=90)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=20)
    assert [i.status for i in infos] == ["SUCCEEDED"] * 7
    finished = [json.loads(line)["job"] for line in done.read_text().splitlines()]
    assert sorted(finished) == sorted(str(i) for i in ids)  # each exactly once
    for i in infos:
        assert [a.end_reason for a in i.attempt_list] == ["COMPLETED"], i

"""The estimate at submit on a live broker (issue 29): a real process holds the GPUs; the
estimate of a new job names the pool, starts it when that job is expected to end, prices it,
and writes nothing; a pending job gets the same estimate; the CLI prints both."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from broker.client.cli import app
from tests.conftest import drive

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_estimate_replays_the_live_queue(make_cluster, clock, tmp_path, monkeypatch):
    c, eng = make_cluster(pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1,
                                  "price_per_node_hour": 4.0}])
    kw = {"team": "research", "workdir": str(tmp_path), "gpus_per_node": 2}
    busy = c.submit(name="busy", command=SLEEP, expected_duration_s=1000, **kw).id
    drive(eng, lambda: c.get(busy).status == "RUNNING")
    started = c.get(busy).attempt_list[0].started_at
    clock.advance(100)
    now = clock.now()
    before = len(c.list())
    est = c.estimate(name="new", command=["true"], expected_duration_s=1800, **kw)
    assert len(c.list()) == before  # nothing written
    assert (est.job_id, est.pool, est.gpu_type, est.market) == (None, "a100", "A100", "onprem")
    left = started + 1000 - now  # 900 s of the running job's estimate are left
    assert est.start_p50 == pytest.approx(now + left) and est.wait_p50_s == pytest.approx(left)
    assert est.start_p10 < est.start_p50 < est.start_p90
    assert est.runtime_s == 1800 and est.cost_usd == pytest.approx(2 * 2.0 * 0.5)  # 2 GPUs x $2 x 0.5 h
    queued = c.submit(name="queued", command=["true"], expected_duration_s=1800, **kw).id
    eng.cycle()
    [mine] = c.estimates([queued])
    assert mine.job_id == queued and mine.start_p50 == pytest.approx(est.start_p50)
    runner = CliRunner()
    monkeypatch.setenv("COLUMNS", "250")
    home = str(c.store.home)
    res = runner.invoke(app, ["--home", home, "submit", "--dry-run", "--name", "x", "--team", "research",
                              "--gpus", "2", "--", "true"])
    assert res.exit_code == 0 and "estimate: pool a100 (A100, onprem); starts in" in res.stdout
    assert len(c.list()) == before + 1
    res = runner.invoke(app, ["--home", home, "status", "--estimate", "--json"])
    assert res.exit_code == 0, res.output
    assert [e["job_id"] for e in json.loads(res.stdout)["estimates"]] == [queued]
    c.cancel(busy)

"""GPU utilization: the agent's sampling through the reader seam (its file test double), the
server's downsampling per attempt from real sync calls on a real database, the held-but-idle
flag after 10 minutes below 5%, and where it shows (status, metrics)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from broker.agent.agent import Agent, Rank
from broker.agent.gpu_util import FileReader, gpus_of
from broker.agent.hardware import Gpus
from broker.client.cli import app
from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control import agents
from broker.spec import parse_config
from broker.state.model import Attempt, Job
from broker.state.model_access import NodeAgent, RankAssignment
from broker.utilization import IDLE_AFTER_S, held_idle, update_attempt
from tests.conftest import config
from tests.observe.test_state_metrics import add, scrape, value

POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 2}


def fresh() -> SimpleNamespace:
    return SimpleNamespace(gpu_util_pct=None, gpu_util_mean_pct=None, gpu_util_s=0.0, gpu_util_at=None,
                           gpu_idle_since=None, ended_at=None)


@pytest.mark.parametrize(("reports", "now_pct", "mean", "idle_since", "idle_at_end"), [
    # (time, [rank pcts]) reports; then the attempt's newest pct, mean, idle_since, held idle?
    ([(0, [80.0])], 80.0, 80.0, None, False),
    ([(0, [80.0, 40.0])], 60.0, 60.0, None, False),  # mean over ranks
    ([(0, [90.0]), (10, [10.0]), (40, [10.0])], 10.0, (90 * 10 + 10 * 30) / 40, None, False),
    ([(0, [None])], None, None, None, False),  # no sample yet: nothing changes
    ([(0, [2.0]), (300, [1.0]), (599, [3.0])], 3.0, 2.0, 0, False),  # gaps > 60 s are not weighed
    ([(t, [1.0]) for t in range(0, 601, 30)], 1.0, 1.0, 0, True),  # 10 minutes below 5%
    ([(t, [1.0]) for t in range(0, 601, 30)] + [(630, [50.0])], 50.0, (1 * 600 + 1 * 30) / 630, None,
     False),  # busy again: the flag clears at once
    ([(0, [1.0]), (30, [1.0, 90.0])], 45.5, 1.0, None, False),  # a busy rank lifts the attempt's mean
])
def test_downsampling_per_attempt_and_the_idle_flag(reports, now_pct, mean, idle_since, idle_at_end):
    a = fresh()
    for t, pcts in reports:
        update_attempt(a, pcts, float(t))
    assert (a.gpu_util_pct, a.gpu_idle_since) == (now_pct, idle_since)
    assert a.gpu_util_mean_pct == pytest.approx(mean) if mean is not None else a.gpu_util_mean_pct is None
    assert held_idle(a, float(reports[-1][0])) is idle_at_end


def test_the_agent_attributes_each_gpus_samples_to_the_rank_holding_it(tmp_path: Path):
    util = tmp_path / "util.json"
    agent = Agent(server="http://127.0.0.1:9", state_dir=tmp_path / "agent", gpus=Gpus(4, "A100"),
                  util=FileReader(util))
    handle = {"rank": 0, "pid": -1, "create_time": 0.0, "run_dir": str(tmp_path / "none")}
    agent.ranks = {1: Rank(1, 10, 0, handle, gpus=gpus_of({"CUDA_VISIBLE_DEVICES": "0,1"})),
                   2: Rank(2, 11, 0, handle, gpus=gpus_of({"CUDA_VISIBLE_DEVICES": "3"}))}
    for sample in ({"0": 100, "1": 50, "2": 99, "3": 0}, {"0": 50, "1": 0, "2": 99, "3": 4}):
        util.write_text(json.dumps(sample))
        agent.sample_utilization()
    got = {r["assignment_id"]: r["gpu_util_pct"] for r in agent._reports()}
    assert got == {1: 50.0, 2: 2.0}  # rank 1: mean of (75, 25); rank 2: GPU 3 only
    assert {r["assignment_id"]: r["gpu_util_pct"] for r in agent._reports()} == {1: None, 2: None}


@pytest.mark.parametrize(("content", "problem"), [
    ("[1, 2]", "must hold a JSON object"), ('{"0": 140}', "within 0 and 100"),
    ('{"x": 1}', "invalid literal"),
])
def test_a_bad_utilization_file_is_a_clear_error(tmp_path: Path, content: str, problem: str):
    (tmp_path / "u.json").write_text(content)
    with pytest.raises(ValueError, match=problem):
        FileReader(tmp_path / "u.json").read()


@pytest.mark.both_dbs
def test_idle_ranks_reported_by_sync_flag_the_job_in_status_and_metrics(tmp_path: Path, clock: FakeClock):
    """Two ranks of one attempt on two agent nodes report 1% then 3% for 10 minutes: the attempt
    is held but idle in `onepool status JOB`, in the SDK's JobInfo and in the metrics; a busy
    report clears it."""
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config(pools=[POOL])))
    [job] = add(c, Job(name="sweep", team="research", gpus_per_node=2, nodes=2, state="RUNNING",
                       submit_time=0.0, queued_at=0.0))
    [att] = add(c, Attempt(job_id=job.id, number=1, pool="onprem", priority="normal", state="RUNNING",
                           started_at=clock.now(), gpus=4,
                           alloc=[["onprem-0", [0, 1]], ["onprem-1", [0, 1]]]))
    ranks = add(c, *[RankAssignment(attempt_id=att.id, rank=i, node=f"onprem-{i}", state="running",
                                    created_at=clock.now()) for i in (0, 1)])
    nodes = add(c, *[NodeAgent(node=f"onprem-{i}", credential_id=f"{i}" * 12) for i in (0, 1)])

    def report(pcts: tuple[float, float]) -> None:
        for node, rank, pct in zip(nodes, ranks, pcts, strict=True):
            req = agents.SyncRequest(ranks=[agents.RankReport(assignment_id=rank.id, state="running",
                                                              gpu_util_pct=pct)])
            with c.store.session() as s:
                agents.sync(s, s.get(NodeAgent, node.node), req, clock.now(), agents.Timing())
                s.commit()

    for _ in range(21):  # every 30 s for 10 minutes
        report((1.0, 3.0))
        clock.advance(30)
    info = c.get(job.id)
    assert info.held_idle and info.gpu_util_pct == 2.0
    assert info.attempt_list[0].gpu_util_mean_pct == pytest.approx(2.0)
    assert clock.now() - info.attempt_list[0].gpu_idle_since >= IDLE_AFTER_S
    got = scrape(c)
    assert value(got, "onepool_gpus_held_idle", team="research", pool="onprem") == 4
    assert value(got, "onepool_jobs_held_idle", team="research") == 1
    assert value(got, "onepool_gpu_utilization_ratio", team="research", pool="onprem") == pytest.approx(0.02)
    out = CliRunner().invoke(app, ["status", str(job.id)], env={"ONEPOOL_HOME": str(c.store.home),
                                                                 "COLUMNS": "200"})
    assert "GPU utilization: 2% now" in out.output and "HELD BUT IDLE" in out.output, out.output
    listing = CliRunner().invoke(app, ["status", "--team", "research"],
                                 env={"ONEPOOL_HOME": str(c.store.home), "COLUMNS": "250"})
    assert "RUNNING (held idle)" in listing.output, listing.output

    report((1.0, 60.0))
    info = c.get(job.id)
    assert not info.held_idle and info.gpu_util_pct == 30.5
    assert value(scrape(c), "onepool_gpus_held_idle", team="research", pool="onprem") == 0

"""A real Prometheus scrapes a running API server (with a metrics token) and a real agent's
metrics listener, and PromQL over its HTTP API returns what the database says after a
preemption and a spot interruption. The engine is driven by the test on an injected clock;
processes, sockets, SQL and Prometheus are real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.agent.gpu_util import FILE_ENV
from tests.agents.harness import Site, agents_cleanup, make_site, spawn_agent, wait_for
from tests.conftest import drive, kill_leftovers, train
from tests.observe.prom import Prometheus, Target, free_port, prometheus

pytestmark = pytest.mark.e2e
POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}
RULES = Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "onepool-rules.yml"


@pytest.fixture
def site(tmp_path: Path, clock) -> Iterator[Site]:  # type: ignore[no-untyped-def]
    s = make_site(tmp_path / "home", clock, pools=[POOL], agent_heartbeat_s=1, grace_s=10)
    yield s
    s.close()
    kill_leftovers(tmp_path / "home" / "runs")


def test_prometheus_sees_a_preemption_and_a_spot_interruption(site: Site, tmp_path: Path, clock):
    c = site.client
    token = c.create_token("research", "metrics", "prometheus").token
    assert token
    agent_port = free_port()
    with agents_cleanup() as agents:
        join = c.join_token("onprem-0").join_token
        util = tmp_path / "gpu-util.json"  # the agent's NVML test double: GPU 0 at 1%, GPU 1 at 3%
        util.write_text(json.dumps({"0": 1.0, "1": 3.0}))
        agents.append(spawn_agent(site.url, tmp_path / "agent", join_token=join,
                                  extra=["--metrics-port", str(agent_port)],
                                  env={FILE_ENV: str(util)}))
        wait_for("onprem-0 joined", lambda: any(n.id == "onprem-0" and n.state == "up" for n in c.nodes()))
        targets = [Target("onepool", site.url.removeprefix("http://"), token),
                   Target("onepool-agent", f"127.0.0.1:{agent_port}")]
        with prometheus(tmp_path / "prom", targets, [RULES]) as prom:
            _preempt_then_interrupt(site, clock, prom)
            _check(site, prom)


def _preempt_then_interrupt(site: Site, clock, prom: Prometheus) -> None:  # type: ignore[no-untyped-def]
    """A low job of research runs on the agent's node past a checkpoint; 30 s (fake) later an
    urgent job of prod preempts it; once it runs again, a spot notice interrupts it."""
    c = site.client
    j = c.submit(name="sweep", team="research", command=train(400, step_s=0.05, ckpt_every=4),
                 gpus_per_node=2, priority="low").id
    drive(site.engine, lambda: (c.get(j).last_step or -1) >= 4, timeout=60)
    prom.wait_value('onepool_agent_ranks{state="running"}', 1)
    prom.wait_value('onepool_jobs_running{team="research"}', 1)
    prom.wait_value('onepool_gpus{pool="onprem",state="in_use"}', 2)
    # The samples came through the agent's heartbeats: 2% over the rank's two GPUs.
    prom.wait_value('onepool_gpu_utilization_ratio{team="research",pool="onprem"}', 0.02)
    assert c.get(j).gpu_util_pct == 2.0
    clock.advance(30)
    u = c.submit(name="urgent", team="prod", command=train(4), gpus_per_node=2, priority="urgent").id
    drive(site.engine, lambda: c.get(u).status == "SUCCEEDED" and c.get(j).status == "RUNNING"
          and len(c.get(j).attempt_list) == 2, timeout=90)
    drive(site.engine, lambda: c.get(j).attempt_list[-1].state == "RUNNING", timeout=60)
    clock.advance(20)
    assert site.engine.interrupt(c.get(j).attempt_list[-1].id, "spot_interruption")
    drive(site.engine, lambda: len(c.get(j).attempt_list) == 3, timeout=60)
    c.cancel(j)
    drive(site.engine, lambda: c.get(j).status == "CANCELLED", timeout=60)


def _check(site: Site, prom: Prometheus) -> None:
    c = site.client
    first, second, _ = c.get(c.list(status=["CANCELLED"])[0].id).attempt_list
    assert (first.end_reason, second.end_reason, second.cause) == ("PREEMPTED", "INTERRUPTED",
                                                                   "spot_interruption")
    # Lost work as the ledger of lost work has it (the training script saves on SIGTERM, so it
    # may be 0; tests/observe/test_state_metrics.py checks non-zero sums by hand).
    prom.wait_value('onepool_preemptions_total{team="research",by_team="prod"}', 1)
    prom.wait_value('onepool_interruptions_total{cause="spot_interruption",team="research",pool="onprem"}', 1)
    prom.wait_value('sum(onepool_lost_gpu_seconds_total{reason="preempted",cause="preempted",'
                    'team="research",by_team="prod"})', first.lost_gpu_s)
    prom.wait_value('sum(onepool_lost_gpu_seconds_total{reason="interrupted",cause="spot_interruption"})',
                    second.lost_gpu_s)
    prom.wait_value('sum(onepool_jobs_running)', 0)
    prom.wait_value('onepool_gpus{pool="onprem",state="free"}', 2)
    prom.wait_value("onepool_agents_connected", 1)
    prom.wait_value('onepool_agent_info{node="onprem-0"}', 1)
    prom.wait_value('onepool_agent_ranks{state="running"}', 0)
    for q in ('onepool_agent_syncs_total{result="ok"}', "onepool_cycle_duration_seconds_count",
              "onepool_plan_duration_seconds_count",
              'sum(onepool_http_request_duration_seconds_count{route="/v1/agent/sync"})'):
        assert (prom.value(q) or 0) > 0, q
    assert {r["metric"]["job"]: r["value"][1] for r in prom.query("up")} == {"onepool": "1",
                                                                          "onepool-agent": "1"}
    routes = {r["metric"]["route"] for r in prom.query("onepool_http_request_duration_seconds_count")}
    # route templates, never a raw id ({sha256} is a template's name)
    assert not [r for r in routes if any(ch.isdigit() for ch in r.split("/")[-1])
                and not r.split("/")[-1].startswith("{")], routes
    # The alert rules evaluate on real series without errors.
    wait_for("rules evaluated",
             lambda: all(r.get("lastEvaluation", "").startswith("2") for r in prom.rules()))
    rules = prom.rules()
    assert len(rules) == 8 and all(r["health"] == "ok" for r in rules), rules

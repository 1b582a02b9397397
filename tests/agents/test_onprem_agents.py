"""Agents on on-prem hosts: separate processes, each in its own network namespace where this
machine allows it, reaching the API over TCP. The engine is driven by the test on an injected
clock; everything else is real (processes, sockets, checkpoints, SQL)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.agents.harness import (
    Netns,
    Site,
    agents_cleanup,
    alive,
    make_site,
    netns,
    spawn_agent,
    wait_for,
)
from tests.conftest import drive, kill_leftovers, train

pytestmark = pytest.mark.e2e
POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 2}


@pytest.fixture
def hosts() -> Iterator[list[Netns]]:
    """Two namespaces standing for two GPU hosts."""
    with ExitStack() as st:
        yield [st.enter_context(netns()), st.enter_context(netns())]


@pytest.fixture
def site(tmp_path: Path, clock, hosts: list[Netns]) -> Iterator[Site]:  # type: ignore[no-untyped-def]
    s = make_site(tmp_path / "home", clock, host=hosts[0].host_ip, pools=[POOL],
                  node_lost_after_s=6, agent_heartbeat_s=1, grace_s=10)
    yield s
    s.close()
    kill_leftovers(tmp_path / "home" / "runs")


def join(site: Site, node: str, tmp: Path, host: Netns, agents: list) -> object:  # type: ignore[type-arg]
    token = site.client.join_token(node).join_token
    a = spawn_agent(site.url, tmp / f"agent-{node}", join_token=token, prefix=host.prefix)
    agents.append(a)
    wait_for(f"{node} joined", lambda: any(n.id == node and n.state == "up" for n in site.client.nodes()))
    return a


def long_job_on_an_agent(site: Site, tmp: Path, hosts: list[Netns], agents: list):  # type: ignore[no-untyped-def,type-arg]
    """An agent joined as onprem-0 and a 200-step job (10 s; the fence stops a rank about 4 s
    after its agent goes quiet) running there past its first checkpoint:
    (the agent, the job id, the rank's supervisor pid)."""
    c = site.client
    a = join(site, "onprem-0", tmp, hosts[0], agents)
    j = c.submit(name="train", team="research", command=train(200, step_s=0.05, ckpt_every=4),
                 gpus_per_node=2).id
    drive(site.engine, lambda: (c.get(j).last_step or -1) >= 4, timeout=60)
    handle = next((a.state_dir / "runs").glob("attempt-*/rank-0/handle.json"))  # type: ignore[attr-defined]
    return a, j, json.loads(handle.read_text())["pid"]


def test_agent_in_its_own_network_joins_runs_a_job_and_ships_its_log(site: Site, tmp_path, hosts):
    with agents_cleanup() as agents:
        join(site, "onprem-0", tmp_path, hosts[0], agents)
        [n] = [n for n in site.client.nodes() if n.id == "onprem-0"]
        assert n.executor == "agent" and n.free_gpus == 2 and n.agent["gpus"] == 2
        assert n.agent["hostname"] and n.agent_seen_s_ago is not None
        c = site.client
        j = c.submit(name="probe", team="research", command=train(6), gpus_per_node=2).id
        drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=60)
        info = c.get(j)
        assert info.attempt_list[0].alloc[0][0] == "onprem-0" and info.attempts == 1
        wait_for("log shipped", lambda: "done: 6 steps" in c.logs(j).data)
        # The rank ran in the agent's state folder on its "host", not in the broker's runs.
        assert (agents[0].state_dir / "runs" / f"attempt-{info.attempt_list[0].id}" / "rank-0").is_dir()


def test_preemption_reaches_the_rank_on_its_agent_and_it_resumes_from_its_checkpoint(site, tmp_path, hosts):
    c = site.client
    with agents_cleanup() as agents:
        join(site, "onprem-0", tmp_path, hosts[0], agents)
        low = c.submit(name="low", team="research", command=train(200, step_s=0.05, ckpt_every=5),
                       gpus_per_node=2, priority="low", checkpoint_interval_s="auto").id
        drive(site.engine, lambda: (c.get(low).last_step or -1) >= 5, timeout=60)
        urgent = c.submit(name="urgent", team="prod", command=train(4), gpus_per_node=2,
                          priority="urgent").id
        drive(site.engine, lambda: c.get(urgent).status == "SUCCEEDED", timeout=60)
        first = c.get(low).attempt_list[0]
        assert first.end_reason == "PREEMPTED" and first.exit_code == 143  # it checkpointed on SIGTERM
        said = "checkpoint interval {:g} s"
        drive(site.engine, lambda: c.get(low).attempts == 2 and c.get(low).checkpoint_advice is not None
              and said.format(c.get(low).checkpoint_interval_s) in c.logs(low, attempt=2).data, timeout=60)
        c.cancel(low)
        drive(site.engine, lambda: c.get(low).status == "CANCELLED", timeout=60)
        info = c.get(low)
        resumed = info.attempt_list[1]
        assert resumed.restored_step == first.reached_step
        # Issue 31: `auto` took the interval advised at the resume from its measured saves and
        # its class's one preemption, and the rank on the agent got it (its log says so).
        adv = info.checkpoint_advice
        assert info.checkpoint_auto and adv is not None and adv.basis == "measured"
        assert adv.save_s < 5 and adv.rate_per_h > 0 and info.checkpoint_interval_s == adv.interval_s
        assert said.format(adv.interval_s) in c.logs(low, attempt=2).data
        kinds = [(e.kind, e.actor) for e in c.events(low)]
        assert ("preempting", "broker") in kinds and ("cancel_requested", f"local:{c.principal.id}") in kinds


def test_a_restarted_agent_adopts_its_running_rank(site, tmp_path, hosts):
    c = site.client
    with agents_cleanup() as agents:
        a = join(site, "onprem-0", tmp_path, hosts[0], agents)
        j = c.submit(name="long", team="research", command=train(60, step_s=0.05), gpus_per_node=2).id
        drive(site.engine, lambda: (c.get(j).last_step or -1) >= 1, timeout=60)
        handle = json.loads(next((a.state_dir / "runs").glob("attempt-*/rank-0/handle.json")).read_text())
        a.kill(signal.SIGKILL)  # no goodbye: the rank keeps running on the host
        assert alive(handle["pid"])
        agents.append(spawn_agent(site.url, a.state_dir, prefix=hosts[0].prefix))  # no join token: saved
        drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=60)
        assert c.get(j).attempts == 1  # adopted, not started twice
        assert "adopted rank 0" in agents[-1].log.read_text()


def test_a_killed_agent_loses_its_node_the_rank_fences_itself_and_the_job_resumes_elsewhere_once(
        site, clock, tmp_path, hosts):
    c = site.client
    with agents_cleanup() as agents:
        a0 = join(site, "onprem-0", tmp_path, hosts[0], agents)
        join(site, "onprem-1", tmp_path, hosts[1], agents)
        # long enough (10 s) that the fence (about 4 s) stops it (a rank done before that
        # completes: see below)
        j = c.submit(name="train", team="research", command=train(200, step_s=0.05, ckpt_every=4),
                     gpus_per_node=2).id
        drive(site.engine, lambda: (c.get(j).last_step or -1) >= 4, timeout=60)
        node = c.get(j).attempt_list[0].alloc[0][0]
        victim = a0 if node == "onprem-0" else agents[1]
        pid = json.loads(next((victim.state_dir / "runs").glob("attempt-*/rank-0/handle.json"))
                         .read_text())["pid"]
        victim.kill(signal.SIGKILL)
        # Cut off from the server, the rank stops itself after the fence (2/3 of 6 s).
        wait_for("rank fenced", lambda: not alive(pid), timeout=20)
        clock.advance(7)  # the broker's clock: past node_lost_after_s
        drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=90)
        info = c.get(j)
        assert [a.end_reason for a in info.attempt_list] == ["LOST", "COMPLETED"]
        assert info.attempt_list[1].alloc[0][0] != node
        assert info.attempt_list[1].restored_step is not None
        assert [n.state for n in c.nodes() if n.id == node] == ["lost"]
        assert "node_lost" in [e.kind for e in c.events()]


def test_a_rank_fenced_during_a_short_outage_is_requeued_not_failed(site, clock, tmp_path, hosts):
    """The agent cannot reach the server for longer than the fence but shorter than the lost
    timeout (a server restart): its rank stops itself (SIGTERM, it checkpoints and exits
    143). The platform ended it, not the job: once the agent reports again, the attempt is
    LOST and the job resumes from its checkpoint and succeeds (found by `make chaos`; it
    used to end FAILED with exit code 143)."""
    import os

    c = site.client
    with agents_cleanup() as agents:
        a, j, pid = long_job_on_an_agent(site, tmp_path, hosts, agents)
        os.killpg(a.proc.pid, signal.SIGSTOP)  # no sync: its lease file ages (the rank's keeps on)
        try:
            wait_for("rank fenced", lambda: not alive(pid), timeout=20)  # 2/3 of 6 s
        finally:
            os.killpg(a.proc.pid, signal.SIGCONT)  # back before the broker's clock loses the node
        drive(site.engine, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"), timeout=90)
        info = c.get(j)
        assert info.status == "SUCCEEDED"
        assert [x.end_reason for x in info.attempt_list] == ["LOST", "COMPLETED"]
        assert info.attempt_list[0].cause == "server_unreachable"  # not node_failure: no node failed
        assert info.attempt_list[1].restored_step is not None
        assert [n.state for n in c.nodes() if n.id == "onprem-0"] == ["up"]


def test_a_killed_supervisor_under_an_agent_leaves_no_process_and_no_concurrent_attempt(
        site, tmp_path, hosts):
    """The supervisor of a rank run by an agent is SIGKILLed; the job process it leaves must
    die before the broker ends the attempt and starts another (found by `make chaos`: the
    agent reported such a rank lost at once, the job ran twice at the same time)."""
    import os

    import psutil

    c = site.client
    with agents_cleanup() as agents:
        _agent, j, pid = long_job_on_an_agent(site, tmp_path, hosts, agents)
        supervisor = psutil.Process(pid)
        [job] = supervisor.children()
        os.kill(supervisor.pid, signal.SIGKILL)  # only the supervisor: the job lives on
        drive(site.engine, lambda: len(c.get(j).attempt_list) == 2, timeout=60)
        assert not alive(job.pid)  # killed before attempt 2 began
        assert c.get(j).attempt_list[0].end_reason == "LOST"
        drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=90)


def test_a_job_done_before_its_node_was_lost_completes_and_is_not_run_again(site, clock, tmp_path, hosts):
    """The rank declared itself done (runtime.done()) but its host died before the agent could
    report the exit: the node is lost, and the attempt is COMPLETED from the mark in the
    store, not requeued to run again (found by `make chaos`: jobs completed twice)."""
    import sys

    c = site.client
    script = ("from broker import runtime; import time; runtime.done(); print('declared done', flush=True); "
              "time.sleep(600)")
    with agents_cleanup() as agents:
        a = join(site, "onprem-0", tmp_path, hosts[0], agents)
        j = c.submit(name="finished", team="research", command=[sys.executable, "-c", script],
                     gpus_per_node=2).id
        logs = a.state_dir / "runs"
        drive(site.engine, lambda: any("declared done" in p.read_text()
                                       for p in logs.glob("attempt-*/rank-0/output.log")), timeout=60)
        a.kill(signal.SIGKILL)  # the host dies with everything on it
        a.ranks().kill_all()
        clock.advance(7)  # past node_lost_after_s
        drive(site.engine, lambda: c.get(j).status != "RUNNING", timeout=60)
        info = c.get(j)
        assert info.status == "SUCCEEDED"
        assert [x.end_reason for x in info.attempt_list] == ["COMPLETED"]
        assert "done_unreported" in [e.kind for e in c.events(j)]


def test_a_join_token_works_once_and_a_bad_one_stops_the_agent_with_a_reason(site, tmp_path, hosts):
    token = site.client.join_token("onprem-0").join_token
    with agents_cleanup() as agents:
        agents.append(spawn_agent(site.url, tmp_path / "a", join_token=token, prefix=hosts[0].prefix))
        wait_for("joined", lambda: any(n.state == "up" for n in site.client.nodes()))
        second = spawn_agent(site.url, tmp_path / "b", join_token=token, prefix=hosts[1].prefix)
        agents.append(second)
        assert second.proc.wait(timeout=30) == 3
        assert "already used" in second.log.read_text()

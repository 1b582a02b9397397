"""A job that cannot start fails alone on an agent, and ends; the agent's loops survive it,
and an agent that cannot go on exits non-zero (so systemd restarts it) instead of staying up
with dead threads. Real `onepool agent` processes and a real API server; the engine is driven
by the test on an injected clock."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.agent.agent import Agent, AgentError
from broker.agent.hardware import Gpus
from tests.agents.harness import Site, agents_cleanup, make_site, spawn_agent, wait_for
from tests.conftest import drive, kill_leftovers, train
from tests.test_start_failures import turn_to_file, vanish, workdir

pytestmark = pytest.mark.e2e
POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}


@pytest.fixture
def site(tmp_path: Path, clock) -> Iterator[Site]:  # type: ignore[no-untyped-def]
    s = make_site(tmp_path / "home", clock, pools=[POOL], node_lost_after_s=6, agent_heartbeat_s=1,
                  grace_s=10)
    yield s
    s.close()
    kill_leftovers(tmp_path / "home" / "runs")


def no_shebang(tmp: Path) -> list[str]:
    path = tmp / "run.sh"
    path.write_text("echo hi\n")
    path.chmod(0o755)
    return [str(path)]


# (name, submit() kwargs from the test's folder, the cause its attempt must end with, what
# changes after the submit: the embedded client checks that a workdir exists, as it did then).
# A 200 KB argument no longer reaches a node: the job spec refuses it at submit (test_spec).
BAD: list[tuple[str, Callable[[Path], dict[str, Any]], str, Callable[[Path], None]]] = [
    ("workdir-typo", lambda t: {"command": ["true"], "workdir": workdir(t)},
     "start_failed:workdir_missing", vanish),
    ("workdir-is-a-file", lambda t: {"command": ["true"], "workdir": workdir(t)},
     "start_failed:workdir_not_a_directory", turn_to_file),
    ("no-shebang", lambda t: {"command": no_shebang(t)}, "start_failed:exec_format_error", vanish),
]


def test_jobs_that_cannot_start_fail_alone_and_the_agent_keeps_serving(site: Site, tmp_path: Path):
    """Another team's job keeps running through every bad start on the same agent, each bad job
    ends FAILED with its cause (no other node to try: at once), and a new job still starts."""
    c = site.client
    with agents_cleanup() as agents:
        token = c.join_token("onprem-0").join_token
        agent = spawn_agent(site.url, tmp_path / "agent", join_token=token)
        agents.append(agent)
        wait_for("joined", lambda: any(n.id == "onprem-0" and n.state == "up" for n in c.nodes()))
        good = c.submit(name="good", team="prod", command=train(120, step_s=0.05), gpus_per_node=1).id
        drive(site.engine, lambda: (c.get(good).last_step or -1) >= 1, timeout=60)
        for name, make, cause, after in BAD:
            bad = c.submit(name=name, team="research", gpus_per_node=1, **make(tmp_path)).id
            after(tmp_path)
            drive(site.engine, lambda b=bad: c.get(b).status not in ("PENDING", "RUNNING"), timeout=30)
            info = c.get(bad)
            assert (info.status, [a.cause for a in info.attempt_list]) == ("FAILED", [cause]), name
            assert any(cause in e.message for e in c.events(bad) if e.kind == "start_failed_final")
            assert agent.proc.poll() is None, f"the agent died on {name}"
            assert c.get(good).status == "RUNNING" and c.get(good).attempts == 1
        wait_for("the reason shipped as the last bad job's log",
                 lambda: "cannot start the rank" in c.logs(bad).data)
        after = c.submit(name="after", team="research", command=train(3), gpus_per_node=1).id
        drive(site.engine, lambda: c.get(after).status == "SUCCEEDED" and c.get(good).status == "SUCCEEDED",
              timeout=60)
        assert c.get(good).attempts == 1  # never lost, never restarted


def test_a_job_that_cannot_start_tries_three_nodes_kills_no_agent_and_fails(tmp_path: Path, clock):
    """The finding: a job with a typo in its workdir went from agent to agent, killing each.
    Now it is tried on max_start_failures (3) different nodes, every agent keeps serving
    (another team's job on the first node keeps running), and the job ends FAILED."""
    site = make_site(tmp_path / "home", clock, pools=[{**POOL, "nodes": 3}], node_lost_after_s=6,
                     agent_heartbeat_s=1, grace_s=10)
    c = site.client
    try:
        with agents_cleanup() as agents:
            for i in range(3):
                token = c.join_token(f"onprem-{i}").join_token
                agents.append(spawn_agent(site.url, tmp_path / f"agent-{i}", join_token=token))
            wait_for("3 agents joined", lambda: sum(n.state == "up" for n in c.nodes()) == 3)
            good = c.submit(name="good", team="prod", command=train(600, step_s=0.05), gpus_per_node=1).id
            drive(site.engine, lambda: (c.get(good).last_step or -1) >= 1, timeout=60)
            bad = c.submit(name="typo", team="research", command=["true"], workdir=workdir(tmp_path),
                           gpus_per_node=1).id
            vanish(tmp_path)
            drive(site.engine, lambda: c.get(bad).status == "FAILED", timeout=60)
            info = c.get(bad)
            nodes = [a.alloc[0][0] for a in info.attempt_list]
            assert len(nodes) == 3 and len(set(nodes)) == 3, nodes
            assert {a.cause for a in info.attempt_list} == {"start_failed:workdir_missing"}
            assert [e.kind for e in c.events(bad)].count("start_retry") == 2
            assert all(a.proc.poll() is None for a in agents), "an agent died"
            assert c.get(good).status == "RUNNING" and c.get(good).attempts == 1
            assert sum(n.state == "up" for n in c.nodes()) == 3
    finally:
        site.close()
        kill_leftovers(tmp_path / "home" / "runs")


def test_an_agent_whose_state_folder_breaks_exits_non_zero(site: Site, tmp_path: Path):
    """Its lease cannot be written after a sync (here: a link into a folder that does not
    exist): after a few failures in a row the agent exits with status 4, for systemd to
    restart it, instead of retrying without end."""
    c = site.client
    with agents_cleanup() as agents:
        token = c.join_token("onprem-0").join_token
        agent = spawn_agent(site.url, tmp_path / "agent", join_token=token)
        agents.append(agent)
        wait_for("joined", lambda: (agent.state_dir / "lease").exists())
        (agent.state_dir / "lease").unlink()
        os.symlink(tmp_path / "no-such-folder" / "lease", agent.state_dir / "lease")
        code = wait_for("the agent exits", lambda: agent.proc.poll(), timeout=40)
        assert code == 4
        assert "times in a row" in agent.log.read_text()


class Boom(BaseException):
    """An error no loop catches (what a bug in the loop machinery amounts to)."""


def test_an_agent_whose_loop_thread_dies_exits_non_zero(site: Site, tmp_path: Path, monkeypatch):
    token = site.client.join_token("onprem-0").join_token
    agent = Agent(server=site.url, state_dir=tmp_path / "agent", gpus=Gpus(2, "A100"), join_token=token,
                  poll_timeout_s=5)

    def boom() -> None:
        raise Boom("the shipper's thread dies")

    monkeypatch.setattr(agent, "_ship_all", boom)
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(agent.run()), daemon=True)
    t.start()
    t.join(timeout=20)
    try:
        assert not t.is_alive(), "the agent stayed up with a dead loop"
        assert got == [4] and "ship logs" in str(agent.error)
    finally:
        agent.stop.set()
        t.join(timeout=10)


# What a rank's folder may hold once a job wrote into it: (name, exit.json text, the report)
FORGED = [
    ("code out of range", '{"code": 100000}', {"state": "exited", "exit_code": 255}),
    ("cause the vocabulary cannot make", '{"code": 1, "start_error": {"cause": "start_failed:../../x"}}',
     {"state": "exited", "exit_code": 1}),
    ("a real start failure", '{"code": 126, "start_error": {"cause": "start_failed:exec_format_error"}}',
     {"state": "exited", "exit_code": 126, "cause": "start_failed:exec_format_error"}),
    ("not a number", '{"code": "x"}', {"state": "lost", "exit_code": None}),
]


@pytest.mark.parametrize(("name", "text", "want"), FORGED, ids=[f[0] for f in FORGED])
def test_the_agent_reports_only_what_the_server_accepts_whatever_a_rank_folder_holds(tmp_path, name, text,
                                                                                     want):
    """A report the server refuses (422) would fail every sync of the node: the agent reports
    a rank's folder only as far as it is well formed."""
    from broker.agent.agent import Rank
    from broker.control.agents import RankReport

    agent = Agent(server="http://127.0.0.1:9", state_dir=tmp_path / "agent", gpus=Gpus(2, "A100"))
    d = agent.procs.run_dir(7, 0)
    d.mkdir(parents=True)
    (d / "exit.json").write_text(text)
    agent.ranks[1] = Rank(1, 7, 0, {"rank": 0, "pid": -1, "create_time": 0.0, "pgid": -1, "run_dir": str(d)})
    [rep] = agent._reports()
    RankReport.model_validate(rep)  # the server accepts it
    assert {k: v for k, v in rep.items() if k in ("state", "exit_code", "cause")} == want


def _http(status: int) -> httpx.HTTPStatusError:
    req = httpx.Request("POST", "http://server/v1/agent/sync")
    return httpx.HTTPStatusError(f"{status}", request=req, response=httpx.Response(status, request=req))


# (case, what each call of the loop's function does in turn, how the agent ends: None = still
# serving when the calls run out, else its exit status)
LOOP_CASES: list[tuple[str, list[BaseException | None], int | None]] = [
    ("server unreachable, without end", [httpx.ConnectError("refused")] * 12, None),
    ("server failing", [_http(503)] * 12, None),
    ("server throttling", [_http(429)] * 12, None),
    ("state folder unwritable", [PermissionError(13, "Permission denied")] * 5, 4),
    ("a bug", [KeyError("x")] * 5, 4),
    ("answers it cannot use", [_http(422)] * 5, 4),
    ("failures not in a row", [OSError("x")] * 4 + [None] + [OSError("x")] * 4, None),
    ("refused", [_http(503), AgentError("revoked", refused=True)], 3),
]


def run_loop(tmp_path: Path, what: str, calls: list[BaseException | None], outside: bool = False
             ) -> tuple[int, list[BaseException | None]]:
    """Run one agent loop whose function does `calls` in turn (None: succeeds), then stops the
    agent; returns the agent's exit status and the calls it did not make."""
    agent = Agent(server="http://127.0.0.1:9", state_dir=tmp_path / "agent", gpus=Gpus(2, "A100"),
                  retry_s=0.001, retry_max_s=0.001)
    left = list(calls)

    def step() -> None:
        if not left:
            agent.stop.set()
            return
        e = left.pop(0)
        if e is not None:
            raise e

    agent._loop(what, 0.0, step, outside)
    return agent.exit_status(), left


@pytest.mark.parametrize(("case", "calls", "status"), LOOP_CASES, ids=[c[0] for c in LOOP_CASES])
def test_a_loop_retries_the_servers_failures_and_gives_up_on_its_own(tmp_path, case, calls, status):
    assert run_loop(tmp_path, "sync", calls) == (status or 0, [])


def _metadata(status: int) -> httpx.HTTPStatusError:
    req = httpx.Request("GET", "http://127.0.0.1:9/latest/meta-data/spot/instance-action")
    return httpx.HTTPStatusError(f"{status}", request=req, response=httpx.Response(status, request=req))


@pytest.mark.parametrize(("case", "calls", "status"), [
    ("metadata service forbidding, without end", [_metadata(403)] * 12, None),
    ("metadata service down, without end", [httpx.ConnectError("refused")] * 12, None),
    ("a bug in the watcher", [KeyError("x")] * 5, 4),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_metadata_loop_outlives_its_service_but_not_its_own_bugs(tmp_path, case, calls, status):
    """The cloud's metadata service failing is not the node's failure: the watcher retries it
    without end (the demo's agents exited after 5 refusals and lost their ranks' work)."""
    assert run_loop(tmp_path, "metadata", calls, outside=True) == (status or 0, [])

"""The multi-machine set-up as the README shows it, driven through the CLI only: `onepool
server` and `onepool agent` as processes, tokens, submit/status/logs -f over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.client.demo_site import free_port
from providers.local import LocalProcesses
from tests.agents.harness import wait_for
from tests.conftest import ROOT, train

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
CONFIG = """
pools:
  - {name: onprem, provider: agent, gpu_type: A100, gpus_per_node: 2, nodes: 1,
     store_shared: true}  # its agents run on this machine: the server's folder is theirs too
teams: [{name: research}, {name: prod}]
broker: {cycle_s: 0.3, grace_s: 10, min_run_s: 0, agent_heartbeat_s: 1, node_lost_after_s: 10}
"""


def cli(home: Path, *args: str, token: str | None = None, url: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    env["ONEPOOL_HOME"] = str(home)
    if url:
        env.update(ONEPOOL_URL=url, ONEPOOL_TOKEN=token or "")
    p = subprocess.run([sys.executable, "-m", "broker.client.cli", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Path, str, list[subprocess.Popen[bytes]]]]:
    home = tmp_path / "home"
    (tmp_path / "onepool.yaml").write_text(CONFIG)
    cli(home, "apply", "-c", str(tmp_path / "onepool.yaml"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    procs: list[subprocess.Popen[bytes]] = []
    with open(tmp_path / "server.log", "wb") as log:
        procs.append(subprocess.Popen([sys.executable, "-m", "broker.client.cli", "--home", str(home),
                                       "server", "--port", str(port)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/v1/healthz", timeout=1).json()["broker_up"]
        except httpx.HTTPError:
            return False

    wait_for("server up and cycling", up)
    yield home, url, procs
    for p in procs:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=20)
    LocalProcesses(tmp_path / "agent" / "runs").kill_all()


def test_server_agent_and_tokens_through_the_cli(lab, tmp_path: Path) -> None:
    home, url, procs = lab
    admin = json.loads(cli(home, "token", "create", "--team", "prod", "--role", "admin", "--json").stdout)
    member = json.loads(cli(home, "token", "create", "--team", "research", "--json", token=admin["token"],
                            url=url).stdout)
    join = json.loads(cli(home, "node", "join-token", "onprem-0", "--json", token=admin["token"],
                          url=url).stdout)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    with open(tmp_path / "agent.log", "wb") as log:
        procs.insert(0, subprocess.Popen(
            [sys.executable, "-m", "broker.client.cli", "agent", "--server", url, "--join-token",
             join["join_token"], "--gpus", "2", "--gpu-type", "A100", "--state-dir",
             str(tmp_path / "agent")], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True))
    auth = {"Authorization": f"Bearer {member['token']}"}
    wait_for("agent joined",
             lambda: httpx.get(f"{url}/v1/nodes", headers=auth, timeout=5).json()[0]["state"] == "up")
    [node] = json.loads(cli(home, "node", "list", "--json", token=member["token"], url=url).stdout)
    assert (node["id"], node["state"]) == ("onprem-0", "up")
    out = cli(home, "submit", "--name", "probe", "--gpus", "2", "--json", "--", *train(8),
              token=member["token"], url=url)
    job = json.loads(out.stdout)
    assert job["team"] == "research"  # the token's team
    logs = cli(home, "logs", str(job["id"]), "-f", token=member["token"], url=url)
    assert "done: 8 steps" in logs.stdout
    status = json.loads(cli(home, "status", str(job["id"]), "--json", token=member["token"], url=url).stdout)
    assert status["status"] == "SUCCEEDED"
    assert status["attempt_list"][0]["alloc"][0][0] == "onprem-0"
    other = cli(home, "status", str(job["id"]), token=admin["token"], url=url)
    assert "probe" in other.stdout  # an admin sees every team
    cli(home, "token", "revoke", member["id"], token=admin["token"], url=url)
    refused = cli(home, "status", token=member["token"], url=url, check=False)
    assert refused.returncode == 2 and "revoked" in refused.stderr
    fresh = json.loads(cli(home, "token", "create", "--team", "research", "--json").stdout)["token"]
    wrong_team = cli(home, "submit", "--name", "x", "--team", "prod", "--", "true", token=fresh,
                     url=url, check=False)
    assert wrong_team.returncode == 2 and "acts for team research only" in wrong_team.stderr

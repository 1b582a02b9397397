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
from tests.conftest import HOST_SETTINGS, ROOT, train

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_") or k in HOST_SETTINGS}
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_") or k in HOST_SETTINGS}
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_") or k in HOST_SETTINGS}
    token_file = tmp_path / "join-token"
    token_file.write_text(join["join_token"] + "\n")
    token_file.chmod(0o600)
    with open(tmp_path / "agent.log", "wb") as log:
        procs.insert(0, subprocess.Popen(
            [sys.executable, "-m", "broker.client.cli", "agent", "--server", url, "--join-token-file",
             str(token_file), "--gpus", "2", "--gpu-type", "A100", "--state-dir",
             str(tmp_path / "agent")], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True))
    # the token is not in the agent's command line, which every user of the host reads in `ps`
    assert join["join_token"] not in Path(f"/proc/{procs[0].pid}/cmdline").read_bytes().decode()
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


# (file content or None for no file, --join-token / $ONEPOOL_JOIN_TOKEN, the token or the error)
JOIN_TOKENS = [
    pytest.param("opj_abc\n", None, "opj_abc", id="file"),
    pytest.param("  opj_abc  \n# a note\n", None, "opj_abc", id="file-first-line-stripped"),
    pytest.param(None, "opj_flag", "opj_flag", id="flag-or-env"),
    pytest.param(None, None, None, id="none-once-joined"),
    pytest.param("opj_abc", "opj_flag", "not both", id="both"),
    pytest.param("\n  \n", None, "is empty", id="empty-file"),
    pytest.param(b"\xff\xfe", None, "cannot read", id="not-text"),
]


@pytest.mark.parametrize(("content", "flag", "expected"), JOIN_TOKENS)
def test_the_agent_reads_its_join_token_from_a_file_or_the_environment(
        tmp_path: Path, content: str | bytes | None, flag: str | None, expected: str | None) -> None:
    from broker.client.cli_remote import join_token_of
    from broker.errors import SpecError

    path = None
    if content is not None:
        path = tmp_path / "join-token"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    if expected is None or expected.startswith("opj_"):
        assert join_token_of(flag, path) == expected
        return
    with pytest.raises(SpecError) as e:
        join_token_of(flag, path)
    assert "--join-token-file" in str(e.value) and expected in str(e.value)


def test_a_missing_join_token_file_is_named(tmp_path: Path) -> None:
    from broker.client.cli_remote import join_token_of
    from broker.errors import SpecError

    with pytest.raises(SpecError, match=r"cannot read .*nope"):
        join_token_of(None, tmp_path / "nope")


def test_a_rented_nodes_user_data_keeps_the_join_token_off_the_command_line() -> None:
    from providers.bootstrap import Boot, user_data

    script = user_data(Boot(server_url="http://s:8421", join_token="opj_secret", node_id="n-0",
                            pool="p", provider="aws", gpus=1, gpu_type="A100"))
    exec_line = script[script.index("exec onepool agent"):]
    assert "opj_secret" not in exec_line and "--join-token" not in exec_line
    assert "export ONEPOOL_JOIN_TOKEN=opj_secret\n" in script

"""`onepool logs -f` over HTTP with real processes: it waits for a pending job to start
(saying why it waits), and follows it across a server killed and started again mid-output,
continuing from the offset it had: every line once, in order."""

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
from broker.client.http import HttpClient
from broker.errors import NotFound, TooManyRequests, Unauthorized, Unavailable
from tests.agents.harness import wait_for
from tests.conftest import HOST_SETTINGS, ROOT, kill_leftovers
from tests.test_cli_remote import cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
CONFIG = """
pools: [{name: local, gpu_type: A100, gpus_per_node: 2, nodes: 1}]
teams: [{name: research}]
broker: {cycle_s: 0.2, grace_s: 5, min_run_s: 0, lease_s: 2}
"""
LINES = 40


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_") or k in HOST_SETTINGS}


class Server:
    """`onepool server` on a fixed port, as a process that can be killed and started again."""

    def __init__(self, home: Path, port: int, log: Path) -> None:
        self.home, self.port, self.log = home, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.client.cli", "--home", str(self.home), "server", "--port",
                 str(self.port)], env=env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_for("server answering", self.answers)

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash: the job processes it started live on (their own sessions)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    home = tmp_path / "home"
    (tmp_path / "onepool.yaml").write_text(CONFIG)
    cli(home, "apply", "-c", str(tmp_path / "onepool.yaml"))
    srv = Server(home, free_port(), tmp_path / "server.log")
    srv.start()
    yield srv
    srv.stop()
    kill_leftovers(home / "runs")


def test_logs_follow_waits_for_the_start_and_reconnects_across_a_server_restart(
        server: Server, tmp_path: Path) -> None:
    token = json.loads(cli(server.home, "token", "create", "--team", "research", "--json").stdout)["token"]
    http = HttpClient(server.url, token)
    go = tmp_path / "go"
    blocker = http.submit(name="blocker", gpus_per_node=2, command=[
        sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"])
    printer = http.submit(name="printer", gpus_per_node=2, command=[
        sys.executable, "-c", f"import time\nfor i in range(1, {LINES + 1}):\n"
                              "    print(f'line {i}', flush=True)\n    time.sleep(0.1)"])
    wait_for("blocker running", lambda: http.get(blocker.id).status == "RUNNING")
    err = tmp_path / "follow.err"
    with open(err, "wb") as e:
        follow = subprocess.Popen(
            [sys.executable, "-m", "broker.client.cli", "logs", str(printer.id), "-f", "--poll-s", "0.1"],
            env={**env(), "ONEPOOL_URL": server.url, "ONEPOOL_TOKEN": token}, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=e)
    try:
        wait_for("the follower says it waits", lambda: "waiting for it to start" in err.read_text())
        go.touch()  # the blocker ends; the printer starts

        def printed(n: int) -> bool:
            try:
                return http.logs(printer.id).data.count("\n") >= n
            except NotFound:
                return False

        wait_for("the printer printed a few lines", lambda: printed(5))
        server.kill()
        wait_for("the follower retries", lambda: "retrying until it answers" in err.read_text())
        server.start()
        out, _ = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
    said = err.read_text()
    assert follow.returncode == 0, said
    assert out.decode() == "".join(f"line {i}\n" for i in range(1, LINES + 1))  # each once, in order
    assert f"job {printer.id} is PENDING, waiting for it to start: " in said
    assert "the server answers again" in said
    assert http.get(printer.id).status == "SUCCEEDED"


def test_logs_follow_ends_on_a_refusal(server: Server) -> None:
    """A 4xx (here: a job the token may not see, or none) ends it at once with that error."""
    token = json.loads(cli(server.home, "token", "create", "--team", "research", "--json").stdout)["token"]
    p = cli(server.home, "logs", "999", "-f", token=token, url=server.url, check=False)
    assert p.returncode == 2 and "no job with id 999" in p.stderr


def test_logs_follow_of_a_job_cancelled_before_it_started_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "onepool.yaml").write_text(CONFIG)
    cli(home, "apply", "-c", str(tmp_path / "onepool.yaml"))  # no broker: the job stays pending
    job = json.loads(cli(home, "submit", "--name", "never", "--team", "research", "--json", "--",
                         "true").stdout)["id"]
    cli(home, "cancel", str(job))
    p = cli(home, "logs", str(job), "-f")
    assert p.stdout == "" and f"job {job} ended CANCELLED without starting" in p.stderr


# (what the server does on each try, the waits between tries, how it ends)
CALLS = [
    pytest.param(["ok"], [], "ok", id="answers"),
    pytest.param([Unavailable("down"), Unavailable("down"), Unavailable("down"), "ok"], [0.5, 1.0, 2.0],
                 "ok", id="down-then-up: backoff"),
    pytest.param([Unavailable("down")] * 7 + ["ok"], [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0], "ok",
                 id="long-outage: backoff capped"),
    pytest.param([TooManyRequests("slow down", retry_after_s=3), "ok"], [3.0], "ok", id="429: when it says"),
    pytest.param([NotFound("no job with id 9")], [], NotFound, id="404: gives up"),
    pytest.param([Unavailable("down"), Unauthorized("token revoked")], [0.5], Unauthorized,
                 id="401-after-restart: gives up"),
]


@pytest.mark.parametrize(("answers", "waits", "ends"), CALLS)
def test_a_follower_call_retries_while_the_server_is_away_and_stops_on_a_refusal(
        answers: list[object], waits: list[float], ends: object) -> None:
    from broker.client.cli_logs import Follower

    todo, slept, said = list(answers), [], []

    def server() -> object:
        got = todo.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    f = Follower(None, 9, None, 0, said.append, sleep=slept.append)
    if isinstance(ends, type):
        with pytest.raises(ends):
            f.call(server)
    else:
        assert f.call(server) == ends
    assert slept == waits and not todo
    went_away = any(isinstance(a, Unavailable) for a in answers)
    assert any("retrying until it answers" in s for s in said) == went_away
    assert any("answers again" in s for s in said) == (went_away and ends == "ok")

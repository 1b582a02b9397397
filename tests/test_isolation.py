"""Jobs run apart from the control plane and from each other (issue 24, parts 2 and 5), with
real processes: run as root, the broker runs each team's ranks as that team's user, with a
clean environment, and no process of an attempt outlives it (cgroup or not), through cancel,
preemption and a killed supervisor. Skipped where this process is not root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.engine import Engine
from broker.errors import SpecError
from broker.spec import parse_config
from broker.spec_types import parse_pass_env, parse_run_as
from providers.isolation import Isolation
from providers.local import LocalProcesses
from tests.conftest import ROOT, config, drive, kill_leftovers
from tests.test_engine_e2e import out_log

# Its checks of leftover processes look at every process of the rank users (uid 61001, ...):
# the module runs on one xdist worker, so no other test of it has ranks alive meanwhile.
pytestmark = pytest.mark.xdist_group("rank-users")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="ranks switch users only when the broker is root")
USERS = {"research": 61001, "prod": 61002}  # numeric: no account needs to exist on this host
CANARY = "ONEPOOL_TEST_SERVER_SECRET_CANARY"


def _job_python() -> tuple[str, dict[str, str]] | None:
    """An interpreter a rank user can run with this checkout and its dependencies, and the
    environment the job needs for it: this one, or the system's of the same version with the
    virtualenv's packages (this one may live where other users cannot reach, e.g. /root)."""
    path = os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])
    v = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for exe in dict.fromkeys([sys.executable, f"/usr/bin/{v}", f"/usr/local/bin/{v}"]):
        try:
            r = subprocess.run([exe, "-c", "import numpy, broker.client.cli"],
                               env={"PYTHONPATH": path, "HOME": "/"}, user=USERS["research"], cwd="/",
                               capture_output=True, timeout=60)
        except OSError:
            continue
        if r.returncode == 0:
            return exe, {"PYTHONPATH": path}
    return None


@pytest.fixture(scope="module")
def job_python() -> tuple[str, dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("ranks switch users only when the broker is root")
    found = _job_python()
    if found is None:
        pytest.skip("no Python here that a rank user can run with onepool's dependencies")
    return found


@pytest.fixture
def jobs_dir() -> Iterator[Path]:
    """Where job folders go: outside pytest's private (0700) tmp, so rank users reach them."""
    d = Path(tempfile.mkdtemp(prefix="onepool-jobs-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path, clock: FakeClock, jobs_dir: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[Client, Engine]]]:
    """cluster(containment, same_user, pass_env, **broker settings) -> (client, engine): ranks
    of research and prod run as their users, or (same_user) as this process's, as under a
    broker that is not root."""
    monkeypatch.setenv(CANARY, "the-servers-secret")  # in the broker's environment, never a job's
    engines: list[Engine] = []

    def make(containment: str = "auto", same_user: bool = False, pass_env: tuple[str, ...] = (),
             **broker: Any) -> tuple[Client, Engine]:
        c = Client(tmp_path / "home", clock=clock)
        c.apply(parse_config(config(**broker)))
        iso = (Isolation(root=False) if same_user else  # as a broker that is not root
               Isolation(run_as=",".join(f"{t}={u}" for t, u in USERS.items()), jobs_dir=jobs_dir,
                         pass_env=pass_env))
        engines.append(Engine(c.store, clock, LocalProcesses(c.store.home / "runs", containment=containment,
                                                             isolation=iso)))
        return c, engines[-1]

    yield make
    for e in engines:
        e.capacity.close()
    kill_leftovers(tmp_path / "home" / "runs")


def pyjob(py: tuple[str, dict[str, str]], code: str, *args: str) -> list[str]:
    return [py[0], "-c", code, *args]


def report(c: Client, job: int) -> dict[str, Any]:
    """The JSON line the job printed last."""
    lines = out_log(c, c.get(job).attempt_list[-1].id).strip().splitlines()
    return json.loads(next(ln for ln in reversed(lines) if ln.startswith("{")))


def user_processes(since: float) -> list[psutil.Process]:
    """Live processes of the test's rank users started after `since` (a time.time()): none
    may be left once their attempts end."""
    out = []
    for p in psutil.process_iter(["uids", "status", "create_time"]):
        if (p.info["uids"] and p.info["uids"].real in USERS.values() and p.info["status"] != "zombie"
                and p.info["create_time"] >= since - 1):
            out.append(p)
    return out


# -- the settings ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("alice", ("alice", {})),
    ("61001:61001", ("61001:61001", {})),
    ("research=alice, prod=bob", (None, {"research": "alice", "prod": "bob"})),
    ("research=alice,*=nobody", ("nobody", {"research": "alice"})),
])
def test_run_as_forms(text: str, expected: tuple[str | None, dict[str, str]]) -> None:
    assert parse_run_as(text) == expected


@pytest.mark.parametrize("text, message", [
    ("alice;rm", "not one of USER"),
    ("Research Team=alice", "not one of USER"),
    ("alice,bob", "two users for every other team"),
    ("research=alice,research=bob", "team 'research' is named twice"),
])
def test_bad_run_as_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="run_as: ") as e:
        parse_run_as(text)
    assert message in str(e.value)


@pytest.mark.parametrize("text, ok", [("PYTHONPATH, AWS_ENDPOINT_URL_S3", True), ("ONEPOOL_TOKEN", False),
                                      ("1BAD", False), ("A-B", False)])
def test_pass_env_names(text: str, ok: bool) -> None:
    if ok:
        assert parse_pass_env(text) == ["PYTHONPATH", "AWS_ENDPOINT_URL_S3"]
    else:
        with pytest.raises(ValueError, match="pass_env: "):
            parse_pass_env(text)


def test_an_unknown_user_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="run_as: no user 'no-such-user-x' on this host"):
        Isolation(run_as="research=no-such-user-x", root=True)


@pytest.mark.parametrize("settings, field", [({"run_as": "a;b"}, "run_as"), ({"pass_env": ["ONEPOOL_TOKEN"]},
                                                                              "pass_env")])
def test_a_process_with_a_bad_host_setting_refuses_to_start(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"invalid agent:\n  - {field}: "):
        Isolation.for_host("agent", **settings)


def test_not_root_cannot_name_another_user() -> None:
    if os.geteuid() == 0:
        pytest.skip("a root process can run ranks as anyone")
    with pytest.raises(ValueError, match="not root"):
        Isolation(run_as="nobody")


def test_root_with_nothing_named_runs_ranks_as_nobody_never_root(jobs_dir: Path) -> None:
    iso = Isolation(root=True, jobs_dir=jobs_dir)
    u = iso.user_for("research")
    assert u is not None and u.name == "nobody" and u.uid != 0
    assert Isolation(root=False).user_for("research") is None  # not root: ranks run as this user


def test_the_rank_environment_is_clean(tmp_path: Path) -> None:
    iso = Isolation(pass_env=["STORE_ENDPOINT"], root=False)
    host = {"PATH": "/secret/bin", "SERVER_SECRET": "x", "ONEPOOL_DATABASE_URL": "postgresql://pw",
            "STORE_ENDPOINT": "http://s3", "ONEPOOL_PROGRESS_EVERY_S": "0.5", "HOME": "/root"}
    env = iso.env({"MY_VAR": "1", "ONEPOOL_JOB_ID": "7"}, None, tmp_path, host=host)
    assert set(env) == {"PATH", "LANG", "HOME", "TMPDIR", "USER", "LOGNAME", "STORE_ENDPOINT", "MY_VAR",
                        "ONEPOOL_JOB_ID", "ONEPOOL_PROGRESS_EVERY_S", "ONEPOOL_JOB_DIR"}
    assert "/secret/bin" not in env["PATH"] and env["TMPDIR"] == str(tmp_path / "tmp")


# -- real ranks as their team's user ------------------------------------------------------------
SHOW = """
import json, os
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "env": dict(os.environ),
                  "umask": os.umask(0), "cwd": os.getcwd()}), flush=True)
"""


@ROOT_ONLY
def test_a_rank_runs_as_its_teams_user_with_only_its_own_environment(cluster, job_python) -> None:
    c, eng = cluster()
    j = c.submit(name="show", team="research", command=pyjob(job_python, SHOW),
                 env={"MY_VAR": "mine", **job_python[1]}).id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    got = report(c, j)
    assert (got["uid"], got["gid"], got["groups"]) == (61001, 61001, [])
    env = got["env"]
    assert CANARY not in env and "ONEPOOL_DATABASE_URL" not in env and "ONEPOOL_HOME" not in env
    assert env["MY_VAR"] == "mine" and env["ONEPOOL_TEAM"] == "research"
    assert {k for k in env if not k.startswith("ONEPOOL_")} <= {
        "PATH", "LANG", "HOME", "TMPDIR", "USER", "LOGNAME", "PYTHONPATH", "MY_VAR", "CUDA_VISIBLE_DEVICES",
        "LC_CTYPE"}  # LC_CTYPE: Python's own UTF-8 coercion
    assert got["umask"] == 0o077 and env["ONEPOOL_JOB_DIR"] == env["HOME"] == env["TMPDIR"][:-4]


@ROOT_ONLY
def test_the_root_supervisor_imports_nothing_from_the_jobs_working_directory(cluster, job_python,
                                                                              tmp_path) -> None:
    """`python -m providers.local_runner` puts its working directory first on sys.path: there
    it must be the rank's run folder, never the job's workdir (a `providers` package there
    would run as root)."""
    wd = tmp_path / "wd"
    (wd / "providers").mkdir(parents=True)
    (wd / "providers" / "__init__.py").write_text("")
    (wd / "providers" / "local_runner.py").write_text(
        f"open({str(wd / 'pwned')!r}, 'w').write(str(__import__('os').getuid()))")
    c, eng = cluster()
    j = c.submit(name="wd", team="research", command=pyjob(job_python, SHOW), workdir=str(wd),
                 env=job_python[1]).id
    drive(eng, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"))
    assert not (wd / "pwned").exists()
    assert c.get(j).status == "SUCCEEDED" and report(c, j)["cwd"] == str(wd)


PROBE = """
import json, os, subprocess, sys
home, victim = sys.argv[1], int(sys.argv[2])
def denied(fn):
    try:
        fn()
    except PermissionError:
        return True
    return False
rank_dir = os.environ["ONEPOOL_RANK_DIR"]
admin = subprocess.run([sys.executable, "-m", "broker.client.cli", "--home", rank_dir + "/../../..",
                        "token", "create", "--team", "research", "--role", "admin"],
                       capture_output=True, text=True, env={**os.environ, "ONEPOOL_HOME": home})
print(json.dumps({
    "database": denied(lambda: open(os.path.join(home, "onepool.db"), "rb").read(1)),
    "home": denied(lambda: os.listdir(home)),
    "own_rank_dir": denied(lambda: os.listdir(rank_dir)),
    "other_environ": denied(lambda: open(f"/proc/{victim}/environ", "rb").read()),
    "other_job_dir": denied(lambda: os.listdir(os.environ["VICTIM_JOB_DIR"])),
    "admin_token": [admin.returncode, admin.stdout[-300:], admin.stderr[-300:]],
}), flush=True)
"""

HOLD = """
import json, os, time
print(json.dumps({"pid": os.getpid(), "job_dir": os.environ["ONEPOOL_JOB_DIR"]}), flush=True)
time.sleep(600)
"""


@ROOT_ONLY
def test_a_rank_cannot_read_the_home_the_database_or_another_teams_rank(cluster, job_python) -> None:
    c, eng = cluster()
    victim = c.submit(name="victim", team="prod", command=pyjob(job_python, HOLD),
                      env={"PROD_SECRET": "s3cr3t", **job_python[1]}).id
    drive(eng, lambda: c.get(victim).status == "RUNNING"
          and "pid" in out_log(c, c.get(victim).attempt_list[0].id))
    v = report(c, victim)
    assert psutil.Process(v["pid"]).uids().real == 61002
    home = str(c.store.home)
    j = c.submit(name="probe", team="research", command=pyjob(job_python, PROBE, home, str(v["pid"])),
                 env={"VICTIM_JOB_DIR": v["job_dir"], **job_python[1]}).id
    drive(eng, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"))
    got = report(c, j)
    assert {k: got[k] for k in ("database", "home", "own_rank_dir", "other_environ", "other_job_dir")} == {
        "database": True, "home": True, "own_rank_dir": True, "other_environ": True, "other_job_dir": True}
    code, out, err = got["admin_token"]
    assert code != 0 and "op_" not in out, (out, err)
    assert c.tokens() == []  # no token was made
    c.cancel(victim)
    drive(eng, lambda: c.get(victim).status == "CANCELLED")


CKPT = """
import numpy as np
from broker import runtime
ck = runtime.restore()
d = runtime.staging_dir(1)
(d / "note.txt").write_text("as the team's user")
runtime.save(1, arrays={"w": np.arange(3)}, files={"": d})
runtime.wait()
runtime.done()
"""


def file_store(request: pytest.FixtureRequest, jobs_dir: Path) -> tuple[str, tuple[str, ...]]:
    """A file store outside the (0700) home, where a rank user can reach its team folder."""
    store = jobs_dir.parent / f"{jobs_dir.name}-store"
    request.addfinalizer(lambda: shutil.rmtree(store, ignore_errors=True))
    return f"file://{store}", ()


def s3_store(request: pytest.FixtureRequest, jobs_dir: Path) -> tuple[str, tuple[str, ...]]:
    """A bucket of the S3 emulator (tests/cloud_stores.py), reached with the credentials and
    endpoint the broker passes to the job by name."""
    return request.getfixturevalue("s3_bucket"), ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                  "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3")


@ROOT_ONLY
@pytest.mark.parametrize("make_store", [file_store, s3_store], ids=lambda f: f.__name__)
def test_the_runtime_checkpoints_as_the_rank_user(cluster, jobs_dir, job_python, request, make_store) -> None:
    uri, names = make_store(request, jobs_dir)
    c, eng = cluster(checkpoint_store=uri, pass_env=names)
    j = c.submit(name="ck", team="research", command=pyjob(job_python, CKPT), env=job_python[1]).id
    drive(eng, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"))
    assert c.get(j).status == "SUCCEEDED", out_log(c, c.get(j).attempt_list[0].id)
    assert c.get(j).last_step == 1
    if uri.startswith("file://"):  # the team's folder is its user's
        team = Path(uri[len("file://"):]) / "research"
        assert (team.stat().st_uid, team.stat().st_mode & 0o777) == (61001, 0o700)
        assert not (team.parent / "prod").exists()


# -- containment: a daemon that left its session with a clean environment ----------------------
# The job ignores SIGTERM (so its end comes by SIGKILL, after the grace time) and starts a
# daemon in a session of its own, with a clean environment (no tag), that writes its pid.
DAEMON = ('trap "" TERM; env -i setsid sh -c "echo \\$\\$ > $ONEPOOL_JOB_DIR/daemon.pid; exec sleep 1000" & '
          'echo started; while :; do sleep 1; done')


def cancel(c: Client, eng: Engine, j: int) -> None:
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED", advance=5.0)  # past the grace time


def preempt(c: Client, eng: Engine, j: int) -> None:
    u = c.submit(name="urgent", team="prod", command=["true"], gpus_per_node=2, priority="urgent").id
    drive(eng, lambda: c.get(u).status == "SUCCEEDED", advance=5.0)
    assert c.get(j).attempt_list[0].end_reason == "PREEMPTED"
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED", advance=5.0)


def kill_supervisor(c: Client, eng: Engine, j: int) -> None:
    a = c.get(j).attempt_list[0]
    handle = json.loads((c.store.home / "runs" / f"attempt-{a.id}" / "rank-0" / "handle.json").read_text())
    os.kill(handle["pid"], signal.SIGKILL)
    drive(eng, lambda: len(c.get(j).attempt_list) == 2)
    assert c.get(j).attempt_list[0].end_reason == "LOST"
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED", advance=5.0)


MODES = {"cgroup": ("cgroup", False), "group": ("group", False), "group, same user": ("group", True)}


@ROOT_ONLY
@pytest.mark.parametrize("end", [cancel, preempt, kill_supervisor], ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_daemon_that_left_its_session_dies_with_its_attempt(cluster, mode, end) -> None:
    """Every mode of the README's table but one: without cgroups, ranks of the broker's own
    user lose such a daemon when their supervisor is SIGKILLed (documented, not tested)."""
    containment, same_user = MODES[mode]
    if same_user and end is kill_supervisor:
        pytest.skip("no cgroup, not root: a daemon that left its session outlives a killed supervisor")
    since = time.time()
    c, eng = cluster(containment, same_user=same_user)
    j = c.submit(name="daemon", team="research", command=["sh", "-c", DAEMON], gpus_per_node=2,
                 priority="low").id
    iso = eng.executor.iso  # type: ignore[attr-defined]
    marker: list[Path] = []

    def daemon_started() -> bool:
        if c.get(j).status != "RUNNING":
            return False
        a = c.get(j).attempt_list[0]
        marker[:] = [iso.job_dir(c.store.home / "runs" / f"attempt-{a.id}" / "rank-0") / "daemon.pid"]
        return marker[0].exists() and marker[0].read_text().strip().isdigit()

    drive(eng, daemon_started)
    pid = int(marker[0].read_text())
    daemon = psutil.Process(pid)
    assert daemon.uids().real == (os.geteuid() if same_user else 61001)
    assert os.getsid(pid) == pid and "ONEPOOL_RANK_DIR" not in daemon.environ()  # own session, no tag
    end(c, eng, j)
    assert not psutil.pid_exists(pid) or daemon.status() == psutil.STATUS_ZOMBIE
    assert user_processes(since) == []


# -- an agent node -------------------------------------------------------------------------------
ON_NODE = """
import json, os, sys
state = sys.argv[1]
def denied(fn):
    try:
        fn()
    except PermissionError:
        return True
    return False
print(json.dumps({"uid": os.getuid(), "env": sorted(os.environ),
                  "credential": denied(lambda: open(os.path.join(state, "agent.json")).read()),
                  "state_dir": denied(lambda: os.listdir(state))}), flush=True)
"""


@ROOT_ONLY
def test_a_rank_on_an_agent_node_cannot_read_the_agents_credential(tmp_path, clock, jobs_dir, job_python,
                                                                     monkeypatch) -> None:
    from tests.agents.harness import agents_cleanup, make_site, spawn_agent, wait_for

    monkeypatch.setenv(CANARY, "the-agents-secret")  # inherited by the agent process
    pool = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}
    site = make_site(tmp_path / "home", clock, pools=[pool], agent_heartbeat_s=1)
    state = tmp_path / "agent"
    try:
        with agents_cleanup() as agents:
            token = site.client.join_token("onprem-0").join_token
            agents.append(spawn_agent(site.url, state, join_token=token, args=[
                "--run-as", "research=61001,prod=61002", "--jobs-dir", str(jobs_dir)]))
            c = site.client
            wait_for("joined", lambda: any(n.state == "up" for n in c.nodes()))
            j = c.submit(name="probe", team="research", command=pyjob(job_python, ON_NODE, str(state)),
                         env=job_python[1]).id
            drive(site.engine, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"), timeout=60)
            wait_for("log shipped", lambda: '"uid"' in c.logs(j).data)
            got = json.loads(next(ln for ln in c.logs(j).data.splitlines() if ln.startswith("{")))
            assert got["uid"] == 61001 and got["credential"] and got["state_dir"]
            assert CANARY not in got["env"] and "ONEPOOL_JOIN_TOKEN" not in got["env"]
            assert (state / "agent.json").stat().st_mode & 0o077 == 0
    finally:
        site.close()
        kill_leftovers(tmp_path / "home" / "runs")

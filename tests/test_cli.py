"""The `onepool` command line.

Happy paths run in-process with typer's CliRunner. The error exit (status 2, one "error:"
message on stderr naming the field) is the job of `main()`, so those cases run the real
console module in a subprocess. No long-running broker is started: the only broker run is
`broker --once`, on a home whose only job is already cancelled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

import broker.client.cli_out
from broker.client.cli import app
from broker.client.sdk import Client
from broker.errors import NotFound, OnepoolError, SpecError
from broker.state.model import Job
from tests.conftest import HOST_SETTINGS

# SQLite only, but for the tests marked both_dbs (transactions they depend on): see tests/conftest.py

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

CONFIG = {
    "pools": [
        {"name": "a100", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 2},
        {"name": "h100", "gpu_type": "H100", "gpus_per_node": 8, "nodes": 1, "market": "spot"},
    ],
    "teams": [{"name": "research"}, {"name": "prod"}],
    "broker": {"cycle_s": 0.2, "min_run_s": 0},
}
NOOP = [sys.executable, "-c", "pass"]  # never launched: no test runs a broker with it pending


# -- helpers ----------------------------------------------------------------------------------
def cli(home: Path, *args: str) -> Any:
    """Run `onepool --home HOME ARGS...` in-process; it must succeed."""
    res = runner.invoke(app, ["--home", str(home), *args])
    assert res.exit_code == 0, f"{args}: exit {res.exit_code}\n{res.output}\n{res.exception!r}"
    return res


def flat(text: str) -> str:
    """Rich wraps plain (non-JSON) output at the console width; undo that for matching."""
    return " ".join(text.split())


def cli_json(home: Path, command: str, *args: str) -> Any:
    """Run `onepool --home HOME COMMAND --json ARGS...` (before any `--`) and parse stdout."""
    return json.loads(cli(home, command, "--json", *args).stdout)


def onepool(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real console module in a subprocess (no ONEPOOL_* from the caller's env but
    the database of this test)."""
    env = {k: v for k, v in os.environ.items()  # and the host settings of tests/conftest.py
           if not k.startswith("ONEPOOL_") or k in ("ONEPOOL_DATABASE_URL", *HOST_SETTINGS)}
    return subprocess.run([sys.executable, "-m", "broker.client.cli", "--home", str(home), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def assert_user_error(proc: subprocess.CompletedProcess[str], *mentions: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    for m in mentions:
        assert m in proc.stderr, f"{m!r} not in stderr: {proc.stderr!r}"


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    p = tmp_path / "onepool.yaml"
    p.write_text(yaml.safe_dump(CONFIG))
    return p


@pytest.fixture
def home(tmp_path: Path, config_path: Path) -> Path:
    """A broker home with CONFIG applied through the CLI."""
    h = tmp_path / "home"
    res = cli(h, "apply", "-c", str(config_path))
    # Rich may wrap (or fold a long path mid-word): compare with all whitespace removed.
    assert "".join(res.stdout.split()) == f"applied{config_path}:2pools,2teams"
    return h


@pytest.fixture
def shared_home(tmp_path: Path) -> Path:
    """A configured home (in this test's database) for the error cases, which must not write
    anything."""
    h = tmp_path / "home"
    p = h.parent / "onepool.yaml"
    p.write_text(yaml.safe_dump(CONFIG))
    cli(h, "apply", "-c", str(p))
    return h


def stored_job(home: Path, job_id: int) -> Job:
    c = Client(home)
    try:
        with c.store.session() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job
    finally:
        c.store.dispose()


# -- happy paths (in-process) -----------------------------------------------------------------
def test_apply_json_prints_the_validated_config(tmp_path: Path, config_path: Path) -> None:
    out = cli_json(tmp_path / "home", "apply", "-c", str(config_path))
    assert [p["name"] for p in out["pools"]] == ["a100", "h100"]
    assert out["pools"][1]["market"] == "spot"
    assert out["pools"][0]["provider"] == "local"  # defaults filled in
    assert [t["name"] for t in out["teams"]] == ["research", "prod"]
    assert out["broker"]["cycle_s"] == 0.2


@pytest.mark.both_dbs
def test_apply_submit_then_status_json(home: Path) -> None:
    info = cli_json(home, "submit", "--name", "bert", "--team", "research",
                    "--experiment", "exp-1", "--priority", "high", "--gpus", "2", "--nodes", "2",
                    "--gpu-type", "A100", "--spot", "never", "--budget-usd", "40",
                    "--checkpoint-interval-s", "60", "--env", "BATCH=32", "--env", "OPT=a=b",
                    "--", "python", "train.py", "--lr", "0.1")
    assert info["status"] == "PENDING"
    jobs = cli_json(home, "status")
    assert isinstance(jobs, list) and len(jobs) == 1
    (job,) = jobs
    assert job["id"] == info["id"]
    expected = {"name": "bert", "team": "research", "experiment": "exp-1", "priority": "high",
                "status": "PENDING", "gpus_per_node": 2, "nodes": 2, "gpu_types": ["A100"],
                "spot": "never", "budget_usd": 40.0, "attempts": 0, "preemptions": 0,
                "attempt_list": [], "end_time": None}
    assert {k: job[k] for k in expected} == expected
    assert job["checkpoint_uri"].endswith(f"/research/exp-1/{job['id']}")
    # Everything after `--` is the command, options included; --env splits at the first '='.
    row = stored_job(home, job["id"])
    assert row.command == ["python", "train.py", "--lr", "0.1"]
    assert row.env == {"BATCH": "32", "OPT": "a=b"}
    assert row.checkpoint_interval_s == 60.0


def test_submit_plain_output_and_status_table(home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Off a terminal rich uses 80 columns and the 13-column table truncates every cell.
    monkeypatch.setattr(broker.client.cli_out, "out", Console(width=200))
    res = cli(home, "submit", "--name", "tiny", "--team", "prod", "--", *NOOP)
    assert "submitted job 1 (tiny, normal)" in flat(res.stdout)
    table = cli(home, "status").stdout
    row = next(line for line in table.splitlines() if "tiny" in line)
    assert "prod" in row and "normal" in row and "PENDING" in row and "1x1" in row


def test_status_one_job_json(home: Path) -> None:
    first = cli_json(home, "submit", "--name", "one", "--team", "research", "--", *NOOP)
    second = cli_json(home, "submit", "--name", "two", "--team", "prod", "--priority", "low",
                      "--", *NOOP)
    got = cli_json(home, "status", str(second["id"]))
    assert isinstance(got, dict)
    assert (got["id"], got["name"], got["team"], got["priority"], got["status"]) == (
        second["id"], "two", "prod", "low", "PENDING")
    assert got["attempt_list"] == []
    assert cli_json(home, "status", str(first["id"]))["name"] == "one"


def test_status_filters(home: Path) -> None:
    cli(home, "submit", "--name", "a", "--team", "research", "--", *NOOP)
    cli(home, "submit", "--name", "b", "--team", "prod", "--", *NOOP)
    assert [j["name"] for j in cli_json(home, "status", "--team", "prod")] == ["b"]
    assert [j["name"] for j in cli_json(home, "status", "--state", "pending")] == ["b", "a"]  # newest first
    assert cli_json(home, "status", "--state", "running") == []


def test_submit_from_file_flags_win(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "from-file", "team": "research", "priority": "low", "gpus_per_node": 8,
        "gpu_types": ["H100"], "spot": "only", "env": {"A": "1"},
        "command": "python train.py --data 'my data'",
    }))
    info = cli_json(home, "submit", "-f", str(spec), "--priority", "urgent", "--env", "B=2")
    assert (info["name"], info["priority"], info["gpus_per_node"], info["spot"]) == (
        "from-file", "urgent", 8, "only")
    assert info["gpu_types"] == ["H100"]
    row = stored_job(home, info["id"])
    assert row.command == ["python", "train.py", "--data", "my data"]  # shlex-split
    assert row.env == {"A": "1", "B": "2"}


def test_events_json_lists_submitted(home: Path) -> None:
    info = cli_json(home, "submit", "--name", "ev", "--team", "research", "--", *NOOP)
    evs = cli_json(home, "events", str(info["id"]))
    assert [e["kind"] for e in evs] == ["submitted"]
    assert evs[0]["job_id"] == info["id"]
    assert "normal job" in evs[0]["message"] and "team research" in evs[0]["message"]
    assert [e["kind"] for e in cli_json(home, "events")] == ["submitted"]


@pytest.mark.both_dbs
def test_cancel_pending_is_immediate_and_the_broker_never_starts_it(home: Path) -> None:
    job = cli_json(home, "submit", "--name", "doomed", "--team", "research", "--", *NOOP)
    jid = str(job["id"])
    out = cli_json(home, "cancel", jid)
    assert (out["id"], out["status"], out["attempts"]) == (job["id"], "CANCELLED", 0)
    assert out["end_time"] is not None and out["waiting_reason"] is None
    assert [e["kind"] for e in cli_json(home, "events", jid)] == ["submitted", "cancelled"]
    cycle = onepool(home, "broker", "--once")
    assert cycle.returncode == 0, cycle.stderr
    after = cli_json(home, "status", jid)
    assert (after["status"], after["attempts"]) == ("CANCELLED", 0)
    assert_user_error(onepool(home, "cancel", jid), f"job {jid}", "already ended", "CANCELLED")


def test_help_describes_every_option_without_type_placeholders() -> None:
    """Every option of every command says what it is for; flags show no `<bool>` and values
    a readable name (FILE, TEAM, USD, ...), as `onepool CMD --help` prints them."""
    import typer.main

    group = typer.main.get_command(app)
    commands = [(n, c) for n, c in group.commands.items()]  # type: ignore[attr-defined]
    commands += [(f"budget {n}", c) for n, c in group.commands["budget"].commands.items()]  # type: ignore
    assert {"status", "pools", "cost", "submit", "dashboard", "budget set"} <= {n for n, _ in commands}
    for name, cmd in commands:
        if hasattr(cmd, "commands"):
            continue
        for p in cmd.params:
            assert getattr(p, "help", None) or p.param_type_name == "argument", (name, p.name)
        text = runner.invoke(app, [*name.split(), "--help"]).output
        assert "<bool>" not in text and "<str>" not in text and "<float>" not in text, (name, text)
    assert "lowercase letters, digits" in runner.invoke(app, ["submit", "--help"]).output


def test_pools_lists_nodes_with_free_gpus_and_price(home: Path) -> None:
    rows = cli_json(home, "pools")
    assert [p["name"] for p in rows] == ["a100", "h100"]
    a100 = rows[0]
    assert [n["id"] for n in a100["nodes"]] == ["a100-0", "a100-1"]
    assert [n["free_gpus"] for n in a100["nodes"]] == [4, 4] and a100["free_gpus"] == 8
    assert a100["usd_per_node_hour"] == 0.0 and a100["market"] == "onprem"
    assert "a100-1" in cli(home, "pools").stdout


# -- error exits (real console module) --------------------------------------------------------
def test_submit_before_apply(tmp_path: Path) -> None:
    proc = onepool(tmp_path / "fresh", "submit", "--name", "x", "--team", "research", "--",
                   *NOOP)
    assert_user_error(proc, "onepool apply")


SUBMIT = ["submit", "--name", "x", "--team", "research"]

# The real console module: exit status 2, "error: ..." on stderr naming the field.
EXIT_2 = [
    pytest.param([*SUBMIT, "--priority", "vip", "--", "true"],
                 ["priority", "urgent", "high", "normal", "low", "'vip'"], id="priority-vip"),
    pytest.param([*SUBMIT, "--env", "BAD", "--", "true"], ["env", "KEY=VALUE", "'BAD'"],
                 id="env-without-equals"),
    pytest.param(["submit", "--team", "research"], ["name: required", "command: required"],
                 id="missing-name-and-command"),
    pytest.param(["submit", "--name", "x[/y]", "--team", "research", "--", "true"],
                 ["name", "'x[/y]'"], id="brackets-printed-literally"),
    pytest.param(["status", "99"], ["no job with id 99"], id="status-unknown-job"),
    pytest.param(["apply", "-c", "/nonexistent/onepool.yaml"],
                 ["/nonexistent/onepool.yaml", "cannot read the file"], id="apply-missing-file"),
    pytest.param(["status", "--state", "BOGUS"],
                 ["status: must be one of pending, running, succeeded", "'bogus'"], id="status-bad-state"),
    pytest.param(["status", "--team", "nlp"], ["team: must be one of research, prod", "'nlp'"],
                 id="status-unknown-team"),
    pytest.param(["budget", "set", "1", "-10"], ["amount: must be a finite number of USD >= 0 (got -10.0)"],
                 id="budget-negative"),
    pytest.param(["budget", "set", "1", "lots"], ["amount: expected a number of USD", "'lots'"],
                 id="budget-not-a-number"),
]


@pytest.mark.parametrize(("args", "mentions"), EXIT_2)
def test_user_errors_exit_2(shared_home: Path, args: list[str], mentions: list[str]) -> None:
    assert_user_error(onepool(shared_home, *args), *mentions)
    assert cli_json(shared_home, "status") == []  # nothing was written


# In-process (cheaper): the command raises the OnepoolError that main() turns into exit 2.
RAISES = [
    pytest.param([*SUBMIT, "--env", "ONEPOOL_JOB_ID=3", "--", "true"], SpecError,
                 ["env", "ONEPOOL_JOB_ID", "set by the broker"], id="env-reserved"),
    pytest.param(["submit", "--name", "x", "--team", "nlp", "--", "true"], SpecError,
                 ["team: must be one of research, prod", "'nlp'"], id="unknown-team"),
    pytest.param([*SUBMIT, "--gpu-type", "V100", "--", "true"], SpecError,
                 ["gpu_types", "'V100'", "A100, H100"], id="unknown-gpu-type"),
    pytest.param([*SUBMIT, "--nodes", "3", "--", "true"], SpecError,
                 ["gpus_per_node/nodes", "a100: 2x4 A100", "h100: 1x8 H100"],
                 id="shape-fits-no-pool"),
    pytest.param([*SUBMIT, "--spot", "maybe", "--", "true"], SpecError,
                 ["spot", "never", "allowed", "only"], id="spot-maybe"),
    pytest.param([*SUBMIT, "--gpus", "0", "--", "true"], SpecError,
                 ["gpus_per_node", "greater than or equal to 1"], id="gpus-zero"),
    pytest.param(["submit", "-f", "/nonexistent/job.yaml"], SpecError,
                 ["/nonexistent/job.yaml", "cannot read job spec"], id="job-file-missing"),
    pytest.param([*SUBMIT, "--", "echo", "x" * 200_000], SpecError,
                 ["command: item 1 is 200000 bytes", "at most 64 KiB"], id="argument-200kb"),
    pytest.param(["cancel", "99"], NotFound, ["no job with id 99"], id="cancel-unknown-job"),
    pytest.param(["events", "99"], NotFound, ["no job with id 99"], id="events-unknown-job"),
    pytest.param(["logs", "99"], NotFound, ["no job with id 99"], id="logs-unknown-job"),
]


@pytest.mark.parametrize(("args", "exc_type", "mentions"), RAISES)
def test_user_errors_raise(home: Path, args: list[str], exc_type: type[OnepoolError],
                           mentions: list[str]) -> None:
    res = runner.invoke(app, ["--home", str(home), *args])
    assert isinstance(res.exception, exc_type), (res.exception, res.output)
    for m in mentions:
        assert m in str(res.exception), f"{m!r} not in {res.exception}"
    assert cli_json(home, "status") == []  # nothing was written


def test_job_file_must_be_a_mapping(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("- python\n- train.py\n")
    res = runner.invoke(app, ["--home", str(home), "submit", "-f", str(spec)])
    assert isinstance(res.exception, SpecError)
    assert res.exception.problems == ["(root): must be a mapping of job fields"]


def test_logs_of_pending_job(home: Path) -> None:
    job = cli_json(home, "submit", "--name", "waiting", "--team", "research", "--", *NOOP)
    res = runner.invoke(app, ["--home", str(home), "logs", str(job["id"])])
    assert isinstance(res.exception, OnepoolError)
    assert "has not started yet" in str(res.exception)


def test_apply_bad_config_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "onepool.yaml"
    bad.write_text(yaml.safe_dump({**CONFIG, "pools": [{**CONFIG["pools"][0], "gpu_typ": "x",
                                                        "market": "cloud"}]}))
    assert_user_error(onepool(tmp_path / "home", "apply", "-c", str(bad)),
                      "pools.0.gpu_typ", "unknown field", "pools.0.market", "onprem")


# -- health (issue 10) ------------------------------------------------------------------------
@pytest.mark.both_dbs
def test_health_and_the_warnings_of_submit_and_status(home: Path) -> None:
    from broker.clock import SystemClock
    from broker.control.lease import Lease

    res = runner.invoke(app, ["--home", str(home), "health", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["broker_up"] is False
    sub = runner.invoke(app, ["--home", str(home), "submit", "--name", "w", "--team", "research",
                              "--", *NOOP])
    assert sub.exit_code == 0 and "no broker has run on this database yet" in sub.stderr
    assert onepool(home, "broker", "--once").returncode == 0  # one cycle, then a clean stop
    st = runner.invoke(app, ["--home", str(home), "status"])
    assert st.exit_code == 0 and "broker down since" in flat(st.stderr)
    assert "states below may be stale" in flat(st.stderr)
    lease = Lease(Client(home).store, SystemClock(), 60)  # a broker that leads and cycles
    assert lease.try_acquire()
    lease.renew(cycled=True)
    try:
        st = runner.invoke(app, ["--home", str(home), "status", "--json"])
        assert st.exit_code == 0 and st.stderr == ""
        h = cli_json(home, "health")
        assert h["broker_up"] is True and h["leader"] == lease.holder and h["fencing"] == 2
        assert "broker up" in flat(cli(home, "health").stdout)
    finally:
        lease.release()


def test_submit_image_is_stored_and_a_malformed_one_names_the_field(home: Path) -> None:
    info = cli_json(home, "submit", "--name", "boxed", "--team", "research",
                    "--image", "ghcr.io/lab/train:3", "--", "python", "train.py")
    assert stored_job(home, info["id"]).image == info["image"] == "ghcr.io/lab/train:3"
    res = runner.invoke(app, ["--home", str(home), "submit", "--name", "bad", "--team", "research",
                              "--image", "ghcr.io/Lab/train:3 --privileged", "--", "true"])
    assert isinstance(res.exception, SpecError)
    assert [p for p in res.exception.problems if p.startswith("image:")], res.exception.problems


def test_submit_code_and_setup_flags(home: Path, tmp_path: Path) -> None:
    """`--code FOLDER` packs it (the job gets its digest, no workdir); `--setup` repeats."""
    from broker.client.sdk import Client
    from broker.codepack import pack
    from broker.state.model import Job

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    job = cli_json(home, "submit", "--name", "c", "--team", "research", "--code", str(proj),
                   "--setup", "echo a", "--setup", "echo b", "--", *NOOP)
    with Client(home).store.session() as s:
        row = s.get(Job, job["id"])
        assert row is not None
        assert (row.code_sha256, row.workdir, row.setup) == (pack(proj).sha256, None, ["echo a", "echo b"])

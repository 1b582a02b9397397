"""Every CLI command answers the same embedded (a home's database) and over HTTP (a real API
server in this process, ONEPOOL_URL and an admin token): one table, each command run both
ways on the same state, the JSON (or text, where a command has no --json) compared."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from broker.api.app import create_app
from broker.client.cli import app
from broker.client.sdk import Client
from broker.clock import FakeClock, SystemClock
from broker.errors import OnepoolError
from tests.agents.harness import serve
from tests.test_rebalance_engine import on_demand_job_with_prem_freed


@dataclass
class Modes:
    home: Path
    url: str
    admin: str
    research: str  # a member of team research
    prod: str  # a member of team prod
    job: int  # running in pool od, a move to prem pays
    done: int  # ended: its output is complete
    config: Path
    client: Client

    def run(self, args: list[str], token: str | None = None, http: bool = False) -> tuple[int, str]:
        """`onepool ARGS`: on the home (no ONEPOOL_URL), or over HTTP with `token`."""
        env = {"ONEPOOL_URL": self.url, "ONEPOOL_TOKEN": token or self.admin} if http else \
            {"ONEPOOL_URL": None, "ONEPOOL_TOKEN": None}
        res = CliRunner().invoke(app, ["--home", str(self.home), *args], env=env)
        if isinstance(res.exception, OnepoolError):  # what main() prints, exit status 2
            return 2, f"error: {res.exception}"
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise res.exception
        return res.exit_code, res.stdout


@pytest.fixture
def modes(make_cluster, clock: FakeClock, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Modes]:
    monkeypatch.setattr(SystemClock, "now", lambda _self: clock.now())  # the CLI's embedded clients
    c, eng, job = on_demand_job_with_prem_freed(make_cluster, clock, expected_s=None)
    done = c.list(status=["succeeded"])[0].id
    eng.cycle()  # charged up to now: costs and health as of this instant
    admin, research, prod = (c.create_token(t, r).token for t, r in
                             (("prod", "admin"), ("research", "member"), ("prod", "member")))
    assert admin and research and prod
    cfg = tmp_path / "onepool.yaml"
    cfg.write_text(json.dumps(c.config().model_dump(mode="json")))
    srv = serve(create_app(c.store, clock))
    yield Modes(c.store.home, srv.url, admin, research, prod, job, done, cfg, c)
    srv.stop()


# (id, the command's arguments; "{job}" / "{done}" / "{config}" are filled in)
COMMANDS = [
    ("status", ["status", "--json"]),
    ("status-all", ["status", "--all", "--json"]),
    ("status-job", ["status", "{job}", "--json"]),
    ("status-team", ["status", "--team", "research", "--status", "running", "--json"]),
    ("health", ["health", "--json"]),
    ("pools", ["pools", "--json"]),
    ("node-list", ["node", "list", "--json"]),
    ("node-list-pool", ["node", "list", "--pool", "od", "--json"]),
    ("rebalance-dry-run", ["rebalance", "--dry-run", "--json"]),
    ("rebalance-history", ["rebalance", "--history", "--json"]),
    ("replay", ["replay", "--set", "broker.grace_s=90", "--set", "teams.prod.weight=3", "--json"]),
    ("cost", ["cost", "--json"]),
    ("cost-by-team", ["cost", "--by", "team", "--json"]),
    ("cost-by-pool", ["cost", "--by", "pool", "--json"]),
    ("lost-by-team", ["lost", "--json"]),
    ("lost-by-cause", ["lost", "--by", "cause", "--json"]),
    ("budget-show", ["budget", "show", "--json"]),
    ("budget-set-team", ["budget", "set", "--team", "research", "100", "--json"]),
    ("budget-set-job", ["budget", "set", "{job}", "50", "--json"]),
    ("token-list", ["token", "list", "--json"]),
    ("events", ["events", "--json"]),
    ("events-job", ["events", "{job}", "--json"]),
    ("logs", ["logs", "{done}"]),
    ("logs-follow-ended", ["logs", "{done}", "-f"]),
    ("apply", ["apply", "-c", "{config}", "--json"]),
    ("submit-dry-run", ["submit", "--name", "x", "--team", "research", "--gpus", "2", "--dry-run",
                        "--json", "--", "true"]),
    ("status-estimate", ["status", "--estimate", "--json"]),
    # people inside teams, changes after submit (issue 28)
    ("status-user", ["status", "--user", "nobody", "--json"]),
    ("events-user", ["events", "--user", "nobody", "--json"]),
    ("cost-by-user", ["cost", "--by", "user", "--json"]),
    ("lost-by-user", ["lost", "--by", "user", "--json"]),
    ("update", ["update", "{job}", "--priority", "high", "--json"]),
    ("release-not-held", ["release", "{job}", "--json"]),
    # the tables people read
    ("status-table", ["status"]),
    ("pools-table", ["pools"]),
    ("node-list-table", ["node", "list"]),
    ("rebalance-table", ["rebalance", "--dry-run"]),
    ("replay-table", ["replay", "--set", "broker.grace_s=90"]),
    ("cost-table", ["cost", "--by", "team"]),
    ("budget-show-table", ["budget", "show"]),
    # refusals: the same error, the same message
    ("cancel-ended", ["cancel", "{done}"]),
    ("status-unknown-job", ["status", "999", "--json"]),
    ("logs-unknown-job", ["logs", "999", "-f"]),
    ("status-unknown-team", ["status", "--team", "ml", "--json"]),
    ("node-list-unknown-pool", ["node", "list", "--pool", "nope", "--json"]),
    ("node-join-token-local", ["node", "join-token", "od-0", "--json"]),
    ("budget-set-negative", ["budget", "set", "--team", "research", "-5", "--json"]),
    ("hold-running", ["hold", "{job}", "--json"]),
    ("hold-ended", ["hold", "{done}", "--json"]),
    ("update-bad-priority", ["update", "{job}", "--priority", "vip", "--json"]),
    ("replay-unknown-setting", ["replay", "--set", "broker.grace=90", "--json"]),
]


REFUSED = {"cancel-ended", "status-unknown-job", "logs-unknown-job", "status-unknown-team",
           "node-list-unknown-pool", "node-join-token-local", "budget-set-negative", "hold-running",
           "hold-ended", "update-bad-priority", "replay-unknown-setting"}
WRITES = {"budget-set-team", "budget-set-job", "apply", "update", "release-not-held"}  # may record events


def fill(m: Modes, args: list[str]) -> list[str]:
    return [a.format(job=m.job, done=m.done, config=m.config) for a in args]


def parsed(out: str) -> Any:
    """The output as JSON where it is, without what names the process that answered (health's
    `served_by`: the API process over HTTP, none embedded)."""
    try:
        got = json.loads(out)
    except ValueError:
        return out
    if isinstance(got, dict):
        got.pop("served_by", None)
    return got


def test_every_command_answers_the_same_embedded_and_over_http(modes: Modes) -> None:
    for name, args in COMMANDS:
        argv = fill(modes, args)
        embedded = modes.run(argv)
        remote = modes.run(argv, http=True)
        assert embedded[0] == (2 if name in REFUSED else 1 if name == "health" else 0), (name, embedded)
        assert (remote[0], parsed(remote[1])) == (embedded[0], parsed(embedded[1])), name
        if name == "rebalance-dry-run":  # and it is not empty: the move of the running job
            assert [m["job"] for m in parsed(remote[1])] == [modes.job]
        if name == "pools":
            assert modes.job in {j for p in parsed(remote[1]) for n in p["nodes"] for j in n["jobs"]}


THIN = """
import json, os, sys
from typer.testing import CliRunner
from broker.client.cli import app
from broker.errors import OnepoolError
out = []
for argv in json.loads(sys.argv[1]):
    r = CliRunner().invoke(app, argv)
    if isinstance(r.exception, OnepoolError):
        out.append([2, f"error: {r.exception}", None])
        continue
    crash = r.exception is not None and not isinstance(r.exception, SystemExit)
    out.append([r.exit_code, r.stdout, repr(r.exception) if crash else None])
loaded = sorted(m for m in sys.modules if m.startswith(("broker.state.", "broker.control", "broker.api")))
print(json.dumps({"results": out, "server_modules": loaded}))
"""


def test_every_command_answers_the_same_on_the_thin_client(modes: Modes) -> None:
    """The same table in an interpreter where the server parts cannot be imported (`pip install
    onepool` on a laptop): every command over HTTP, no home."""
    import os
    import subprocess
    import sys

    from tests.test_thin_client import BLOCK, ROOT

    table = sorted(COMMANDS, key=lambda c: c[0] in WRITES)  # reads first: they see the state unchanged
    argvs = [fill(modes, args) for _, args in table]
    before = {name: modes.run(argv) for (name, _), argv in zip(table, argvs, strict=True)
              if name not in WRITES}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    env.update(PYTHONPATH=str(ROOT), ONEPOOL_URL=modes.url, ONEPOOL_TOKEN=modes.admin)
    p = subprocess.run([sys.executable, "-c", BLOCK + THIN, json.dumps(argvs)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["server_modules"] == []
    for (name, _), argv, (code, out, crash) in zip(table, argvs, got["results"], strict=True):
        assert crash is None, (name, crash)
        want = before[name] if name not in WRITES else modes.run(argv)  # writes: idempotent answers
        assert (code, parsed(out)) == (want[0], parsed(want[1])), name


# (token, the job ids a member sees in the moves and on the nodes)
MEMBERS = [("research", True), ("prod", False)]


@pytest.mark.parametrize(("who", "sees"), MEMBERS, ids=[m[0] for m in MEMBERS])
def test_a_member_sees_its_own_teams_jobs_only(modes: Modes, who: str, sees: bool) -> None:
    token = getattr(modes, who)
    code, out = modes.run(["rebalance", "--dry-run", "--json"], token, http=True)
    assert code == 0 and [m["job"] for m in json.loads(out)] == ([modes.job] if sees else [])
    code, out = modes.run(["pools", "--json"], token, http=True)
    held = {j for p in json.loads(out) for n in p["nodes"] for j in n["jobs"]}
    assert code == 0 and (modes.job in held) == sees


def test_a_dry_run_on_a_fresh_home_needs_no_lease_and_writes_nothing(tmp_path: Path) -> None:
    from broker.spec import parse_config
    from broker.state.model import Event, Setting
    from tests.conftest import config

    c = Client(tmp_path / "home")
    c.apply(parse_config(config()))  # no broker ever ran: no lease, no broker id
    with c.store.session() as s:
        before = (sorted(r.key for r in s.exec(select(Setting))), len(s.exec(select(Event)).all()))
    res = CliRunner().invoke(app, ["--home", str(c.store.home), "rebalance", "--dry-run"],
                             env={"ONEPOOL_URL": None})
    assert res.exit_code == 0, res.output
    assert "no move pays for itself now" in res.stdout
    with c.store.session() as s:
        after = (sorted(r.key for r in s.exec(select(Setting))), len(s.exec(select(Event)).all()))
    assert after == before


def test_a_read_only_store_keeps_no_write_and_refuses_a_commit(tmp_path: Path) -> None:
    from broker.errors import ReadOnly
    from broker.state.model import Setting
    from broker.state.store import ReadOnlyStore

    c = Client(tmp_path / "home")
    view = ReadOnlyStore(c.store)
    with view.session() as s:
        s.add(Setting(key="kept?", value={}))
        s.flush()
        assert s.get(Setting, "kept?") is not None  # seen inside its own session ...
    with c.store.session() as s:
        assert s.get(Setting, "kept?") is None  # ... and rolled back at its end
    with pytest.raises(ReadOnly, match="read-only"), view.session() as s:
        s.add(Setting(key="committed?", value={}))
        s.commit()
    with c.store.session() as s:
        assert s.get(Setting, "committed?") is None

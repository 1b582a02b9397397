"""`onepool cost` and `onepool budget` on a seeded home (in-process), and their error exits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from broker.client.cli import app
from tests.dashboard.seed import seed

# SQLite only, but for the tests marked both_dbs (transactions they depend on): see tests/conftest.py

runner = CliRunner()


@pytest.mark.parametrize("by", ["experiment", "team", "job", "pool", "market", "day"])
def test_cost_json_rows_equal_the_query_and_every_view_has_one_total(tmp_path, by):
    c = seed(tmp_path / "home")
    r = runner.invoke(app, ["--home", str(c.store.home), "cost", "--by", by, "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert all(set(x) == {"key", "usd", "gpu_hours", "idle_usd", "lost_gpu_hours", "lost_usd", "jobs"}
               for x in rows)
    assert [(x["key"], x["usd"]) for x in rows] == [(q.key, round(q.usd, 6)) for q in c.costs(by)]
    by_pool = sum(q.usd for q in c.costs("pool"))
    assert round(sum(x["usd"] for x in rows), 2) == round(by_pool, 2) and by_pool > 0


@pytest.mark.both_dbs
def test_cost_table_and_budget_commands(tmp_path):
    c = seed(tmp_path / "home")
    home = ["--home", str(c.store.home)]
    r = runner.invoke(app, [*home, "cost", "--by", "experiment"])
    assert r.exit_code == 0 and "lr-sweep" in r.stdout and "release" in r.stdout
    r = runner.invoke(app, [*home, "budget", "set", "--team", "prod", "25"])
    assert r.exit_code == 0 and "team prod: month budget $25.00" in r.stdout
    r = runner.invoke(app, [*home, "budget", "show", "--json"])
    assert {x["team"]: x["usd"] for x in json.loads(r.stdout)} == {"research": 50.0, "prod": 25.0}


@pytest.mark.parametrize(("args", "message"), [
    (["cost", "--by", "region"], "by: must be one of experiment, team, job, pool, market, day"),
    (["cost", "--since", "yesterday"], "since: expected epoch seconds"),
    (["budget", "set", "1"], "give JOB AMOUNT, or --team TEAM AMOUNT"),
    (["budget", "set", "999", "10"], "no job with id 999"),
])
def test_money_errors_exit_2_with_a_clear_message(tmp_path, args, message):
    home = seed(tmp_path / "home").store.home
    p = subprocess.run([sys.executable, "-m", "broker.client.cli", "--home", str(home), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in " ".join(p.stderr.split())

"""`onepool replay` (issue 31): a home's recorded history, exported to the simulator's trace
and replayed under its own config, reproduces what the home measured; a changed setting
moves the numbers the expected way; a bad `--set` names the field.

The home is real (the store, its migrated SQLite schema, the applied config); its history
is written with the store's rows as a FIFO broker on the pool would have run it (a builder:
`record`), with no cycle latency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.errors import SpecError
from broker.sim.trace import read_trace, write_trace
from broker.spec import parse_config
from broker.spec_set import with_sets
from tests.conftest import config
from tests.history import record, workload

# Within this of the recorded mean wait, per class and per team: the replay plans at most
# every cycle_s (0.2 s here) and learns runtimes as it goes, the recorded broker was FIFO.
TOLERANCE_S = 30.0


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Client:
    # module scope: made once (the autouse `db` fixture is per test, so this home migrates
    # on its own: one real migration for the module)
    clock = FakeClock()
    c = Client(tmp_path_factory.mktemp("replay") / "home", clock=clock)
    c.apply(parse_config(config(teams=[{"name": "nlp"}, {"name": "vision"}])))
    t0 = clock.now()
    record(c, workload(), gpus=2, t0=t0)
    clock.advance(3 * 3600)
    return c


@pytest.fixture(scope="module")
def weight_change(home: Client) -> dict[str, Any]:
    return home.replay(["teams.nlp.weight=8"])


def test_the_replay_under_the_current_config_reproduces_the_recorded_outcome(weight_change: dict[str, Any]
                                                                              ) -> None:
    rec, cur = weight_change["recorded"], weight_change["current"]
    assert weight_change["jobs"] == 16
    assert cur["jobs_completed"] == rec["jobs_completed"] == 16
    assert rec["wait_s_mean"]["all"] > 600  # a queue really built up
    for c in ("normal", "all"):
        assert abs(cur["wait_s_mean"][c] - rec["wait_s_mean"][c]) <= TOLERANCE_S, c
    assert cur["preemptions"] == rec["preemptions"] == 0
    assert abs(cur["onprem_occupancy"] - rec["onprem_occupancy"]) <= 0.02
    assert weight_change["fidelity"]["wait_s_mean"]["all"] == pytest.approx(
        cur["wait_s_mean"]["all"] - rec["wait_s_mean"]["all"])


def test_a_heavier_team_waits_less_and_the_other_more(weight_change: dict[str, Any]) -> None:
    cur, new, d = weight_change["current"], weight_change["changed"], weight_change["diff"]
    assert d["wait_s_by_team"]["nlp"]["mean"] < 0
    assert d["wait_s_by_team"]["vision"]["mean"] > 0
    assert new["wait_s_by_team"]["nlp"]["mean"] < cur["wait_s_by_team"]["nlp"]["mean"]
    # equal jobs on a busy pool: the order moves waits between teams, not their mean
    assert abs(d["wait_s_mean"]["all"]) <= TOLERANCE_S


def test_another_config_file_with_more_gpus_cuts_the_waits(home: Client) -> None:
    other = config(teams=[{"name": "nlp"}, {"name": "vision"}],
                   pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 2}])
    out = home.replay([], other)
    assert out["changed"]["wait_s_mean"]["all"] < out["current"]["wait_s_mean"]["all"] / 4
    assert out["diff"]["onprem_occupancy"] < 0


@pytest.mark.parametrize(("item", "says"), [
    ("broker.grace_seconds=120", "broker.grace_seconds: unknown field"),
    ("broker.grace_s=-5", "broker.grace_s: Input should be greater than or equal to 0"),
    ("broker.grace_s=soon", "broker.grace_s: Input should be a valid number"),
    ("teams.ml.weight=2", "teams.ml: no such item; known: vision, nlp"),
    ("teams.nlp.weight=0", "teams.nlp.weight: Input should be greater than 0"),
    ("teams.nlp.wieght=2", "teams.nlp.wieght: unknown field"),
    ("broker.grace_s", "expected PATH=VALUE"),
    ("teams.weight=2", "teams: name an item, e.g. teams.NAME.weight=VALUE"),
    ("teams=[]", "teams: List should have at least 1 item"),
    ("broker.grace_s.x=1", "broker.grace_s: is a value, not a section"),
])
def test_a_bad_set_names_the_field(item: str, says: str) -> None:
    cfg = parse_config(config(teams=[{"name": "vision"}, {"name": "nlp"}]))
    with pytest.raises(SpecError) as e:
        with_sets(cfg, [item])
    assert says in str(e.value)


def test_sets_apply_through_the_config() -> None:
    cfg = parse_config(config(teams=[{"name": "vision"}, {"name": "nlp"}]))
    got = with_sets(cfg, ["broker.grace_s=120", "teams.nlp.weight=2", "broker.rebalance.max_moves=1"])
    assert (got.broker.grace_s, got.teams[1].weight, got.broker.rebalance.max_moves) == (120, 2, 1)
    assert got.teams[0].weight == cfg.teams[0].weight


def test_the_cli_exports_a_trace_and_prints_the_comparison(home: Client, tmp_path: Path) -> None:
    from broker.client.cli import app

    runner = CliRunner()
    env = {"ONEPOOL_HOME": str(home.store.home), "ONEPOOL_URL": ""}
    r = runner.invoke(app, ["replay", "--export", str(tmp_path / "h")], env=env)
    assert r.exit_code == 0, r.output
    trace = read_trace(tmp_path / "h" / "trace.csv")
    assert [(t.team, t.priority, t.duration_s) for t in trace[:2]] == [("vision", "normal", 600.0),
                                                                       ("nlp", "normal", 600.0)]
    write_trace(tmp_path / "again.csv", trace)
    assert read_trace(tmp_path / "again.csv") == trace
    r = runner.invoke(app, ["replay", "--set", "broker.grace_sec=1"], env=env)
    assert isinstance(r.exception, SpecError)  # main() prints it as one line, exit status 2
    assert "broker.grace_sec: unknown field" in str(r.exception)
    r = runner.invoke(app, ["replay", "--set", "broker.grace_s=120", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["diff"]["preemptions"] == 0

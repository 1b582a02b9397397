"""What moves realized, from the ledger, and how it corrects the next decisions (issue 31):
broker.control.rebalancer.realized_gross / corrected, and `onepool rebalance --history`.
Rows are written with the real store (a migrated home), no processes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.client.sdk import Client
from broker.control.rebalance_history import corrected, past_moves
from broker.control.rebalancer import realized_gross
from broker.policy.rebalance import RebalanceConfig
from broker.policy.rebalance_realized import PRIOR_MOVES
from broker.spec import parse_config
from broker.state.events import record
from broker.state.model import Attempt, Job, JobState, LedgerEntry
from tests.conftest import config

H = 3600.0
MOVE = {"usd_per_gpu_hour_from": 16.0, "moved_at": 1000.0, "from_nodes": ["od-0"], "from_pool": "od",
        "to_pool": "a100"}


def ledger(kind: str, node: str, start: float, end: float, gpus: int, rate: float,
           attempt: int | None = None) -> LedgerEntry:
    return LedgerEntry(kind=kind, pool=node.split("-")[0], node=node, attempt_id=attempt, start=start,
                       end=end, gpus=gpus, usd_per_gpu_hour=rate, usd=gpus * (end - start) / H * rate)


@pytest.fixture
def home(tmp_path: Any) -> Client:
    c = Client(tmp_path / "home")
    # which pools rent is given to realized_gross: here they are plain rows the attempts name
    c.apply(parse_config(config(pools=[{"name": n, "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}
                                       for n in ("a100", "od", "sp")])))
    return c


# (case, ledger rows besides B's, pools that rent, other jobs started (pool, at, GPUs, GPU
# types), gross saving): B ran 2 GPUs for 1 h at $2/GPU-h in place of A's $16/GPU-h
RENTED = frozenset({"od", "sp"})
CASES = [
    ("A's GPUs stopped costing", [], RENTED, [], 2 * 16.0 - 2 * 2.0),
    ("A's rented node stood idle 30 min after the move", [("idle", "od-0", 1000, 1000 + H / 2, 2, 16.0)],
     RENTED, [], 28.0 - 16.0),
    ("A's rented node kept running its other job: the freed GPUs billed idle all along",
     [("idle", "od-0", 1000, 1000 + H, 2, 16.0)], RENTED, [], 28.0 - 32.0),
    ("idle before the move does not count", [("idle", "od-0", 0, 1000, 2, 16.0)], RENTED, [], 28.0),
    ("A does not rent (its nodes cost the same either way): its idle time is not the move's",
     [("idle", "od-0", 1000, 1000 + H, 2, 16.0)], frozenset(), [], 28.0),
    ("30 min after the move a job that could have used B's GPUs rented: the saving stops there",
     [], RENTED, [("sp", 1000 + H / 2, 2, [])], 14.0),
    ("a job needing another GPU type does not displace", [], RENTED,
     [("sp", 1000 + H / 2, 2, ["H100"])], 28.0),
    ("a bigger job does not displace", [], RENTED, [("sp", 1000 + H / 2, 4, [])], 28.0),
    ("a job started before the move does not displace", [], RENTED, [("sp", 900, 2, [])], 28.0),
]


@pytest.mark.parametrize(("case", "rows", "rented", "others", "gross"), CASES, ids=[c[0] for c in CASES])
def test_realized_gross_from_the_ledger(home: Client, case: str, rows: list[tuple[Any, ...]],
                                        rented: frozenset[str], others: list[tuple[Any, ...]],
                                        gross: float) -> None:
    with home.store.session() as s:
        for i, (pool, at, gpus, types) in enumerate(others):
            j = Job(name=f"o{i}", team="research", command=["x"], gpu_types=types, submit_time=at,
                    queued_at=at, state=JobState.RUNNING)
            s.add(j)
            s.flush()
            s.add(Attempt(job_id=j.id or 0, number=1, pool=pool, priority="normal", started_at=at, gpus=gpus))
        b = Attempt(id=70, job_id=10_000, number=2, pool="a100", priority="normal", started_at=1000.0,
                    ended_at=1000.0 + H, gpus=2)
        s.add(ledger("gpu", "a100-0", 1000, 1000 + H, 2, 2.0, attempt=70))
        for r in rows:
            s.add(ledger(*r))
        s.flush()
        assert realized_gross(s, MOVE, b, rented, "A100") == pytest.approx(gross)
        assert realized_gross(s, MOVE, Attempt(id=80, job_id=1, number=1, pool="a100", priority="normal",
                                               started_at=0.0, gpus=2), rented, "A100") is None


def realized(s: Any, i: int, expected: float, gross: float, to: str = "prem") -> None:
    record(s, float(i), "rebalance_realized", "done", job_id=i, from_pool="od", to_pool=to,
           expected_saving_usd=expected, realized_gross_usd=gross, realized_saving_usd=gross - 1.0,
           realized_cost_usd=1.0)


@pytest.mark.parametrize(("history", "move", "defrag"), [
    ([], 1.0, 1.0),
    ([(100.0, 100.0)] * 10, 1.0, 1.0),
    ([(100.0, 0.0)] * 20, PRIOR_MOVES / (20 + PRIOR_MOVES), 1.0),
    ([(100.0, 25.0)] * 95, (95 * 25 + PRIOR_MOVES * 100) / (100 * (95 + PRIOR_MOVES)), 1.0),
])
def test_past_moves_correct_the_next_decisions(home: Client, history: list[tuple[float, float]],
                                               move: float, defrag: float) -> None:
    with home.store.session() as s:
        for i, (e, g) in enumerate(history):
            realized(s, i + 1, e, g)
        realized(s, 999, 50.0, 50.0, to="od")  # a defragmenting move (same pool): its own kind
        s.commit()
        rc = corrected(s, RebalanceConfig(min_saving_usd=3.0))
        assert (rc.realized_move, rc.realized_defrag, rc.min_saving_usd) == (
            pytest.approx(move), pytest.approx(defrag), 3.0)
        assert len(past_moves(s)) == len(history) + 1


def test_an_event_from_before_the_gross_was_recorded_counts_net_plus_cost(home: Client) -> None:
    with home.store.session() as s:
        record(s, 1.0, "rebalance_realized", "old", job_id=1, from_pool="od", to_pool="prem",
               expected_saving_usd=10.0, realized_saving_usd=3.0, realized_cost_usd=1.0)
        s.commit()
        (m,) = past_moves(s)
        assert (m.kind, m.expected_saving_usd, m.realized_saving_usd) == ("move", 10.0, 4.0)


def test_rebalance_history_shows_expected_and_realized(home: Client) -> None:
    from broker.client.cli import app

    with home.store.session() as s:
        for i in range(3):
            realized(s, i + 1, 100.0, 10.0)
        s.commit()
    runner = CliRunner()
    env = {"ONEPOOL_HOME": str(home.store.home), "ONEPOOL_URL": ""}
    r = runner.invoke(app, ["rebalance", "--history", "--json"], env=env)
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert [m["expected_saving_usd"] for m in got["moves"]] == [100.0] * 3
    ratio = (30 + PRIOR_MOVES * 100) / (300 + PRIOR_MOVES * 100)
    assert got["totals"]["move"] == {"moves": 3, "expected_saving_usd": 300.0, "realized_saving_usd": 30.0,
                                     "ratio": pytest.approx(ratio, abs=1e-4)}
    r = runner.invoke(app, ["rebalance", "--history"], env=env)
    assert r.exit_code == 0 and "realized" in r.output

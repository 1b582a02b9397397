"""What finished moves expected and realized (rebalance_realized events, issue 31): the
correction of the next decisions (`corrected`) and `onepool rebalance --history` (`history`).

Each rebalance_realized event (broker.control.rebalancer) holds the move's expected gross
saving as decided and its realized gross saving from the ledger (`realized_gross_usd`; for
events recorded before it was, the realized net saving plus the move's cost). The newest
PAST_MOVES of them give, per kind ("move", "defrag"), the ratio of realized to expected
(broker.policy.rebalance_realized.realization) that scales the next decisions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlmodel import Session, col, select

from broker.policy.rebalance import RebalanceConfig
from broker.policy.rebalance_realized import KINDS, PastMove, kind_of, realization
from broker.state.model import Event

PAST_MOVES = 500  # the newest finished moves that correct the next decisions


def _events(s: Session, limit: int, jobs: set[int] | None = None) -> list[Event]:
    q = select(Event).where(Event.kind == "rebalance_realized")
    if jobs is not None:
        q = q.where(col(Event.job_id).in_(jobs))
    return list(s.exec(q.order_by(col(Event.time).desc(), col(Event.id).desc()).limit(limit)).all())


def _past(e: Event) -> PastMove:
    d = e.data
    gross = d.get("realized_gross_usd")
    if gross is None:  # recorded before the gross saving was: net + the move's cost
        gross = d.get("realized_saving_usd", 0.0) + d.get("realized_cost_usd", 0.0)
    return PastMove(kind_of(d.get("from_pool", ""), d.get("to_pool", "")),
                    float(d.get("expected_saving_usd", 0.0)), float(gross))


def past_moves(s: Session, limit: int = PAST_MOVES) -> list[PastMove]:
    """The newest finished moves (rebalance_realized events), newest first."""
    return [_past(e) for e in _events(s, limit)]


def corrected(s: Session, rc: RebalanceConfig) -> RebalanceConfig:
    """`rc` with what past moves realized per dollar expected, per kind (module docstring)."""
    past = past_moves(s)
    return replace(rc, realized_move=realization(past, "move"), realized_defrag=realization(past, "defrag"))




def history(s: Session, limit: int = 200, jobs: set[int] | None = None) -> dict[str, Any]:
    """The newest `limit` finished moves (of `jobs` only, if given), newest first, each with
    its expected and realized gross and net saving; per kind, the totals over them and the
    ratio the next decisions use (over the newest PAST_MOVES of every team's moves)."""
    rows = []
    totals: dict[str, dict[str, Any]] = {}
    for e in _events(s, limit, jobs):
        m, d = _past(e), e.data
        cost = float(d.get("expected_cost_usd", 0.0))
        rows.append({"time": e.time, "job": e.job_id, "kind": m.kind, "from_pool": d.get("from_pool"),
                     "to_pool": d.get("to_pool"), "reason": d.get("reason"),
                     "expected_saving_usd": round(m.expected_saving_usd, 4),
                     "realized_saving_usd": round(m.realized_saving_usd, 4),
                     "expected_net_usd": round(m.expected_saving_usd - cost, 4),
                     "realized_net_usd": round(float(d.get("realized_saving_usd", 0.0)), 4),
                     "ran_h": d.get("ran_h")})
        t = totals.setdefault(m.kind, {"moves": 0, "expected_saving_usd": 0.0, "realized_saving_usd": 0.0})
        t["moves"] += 1
        t["expected_saving_usd"] += m.expected_saving_usd
        t["realized_saving_usd"] += m.realized_saving_usd
    past = past_moves(s)
    for kind in KINDS:
        if kind in totals:
            t = totals[kind]
            t["expected_saving_usd"] = round(t["expected_saving_usd"], 2)
            t["realized_saving_usd"] = round(t["realized_saving_usd"], 2)
            t["ratio"] = round(realization(past, kind), 4)
    return {"moves": rows, "totals": totals}

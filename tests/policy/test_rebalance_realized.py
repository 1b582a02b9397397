"""The corrected move rule (issue 31): a move's expected saving is scaled by what past moves
of its kind realized (broker.policy.rebalance_realized), and a move pays only then."""

from __future__ import annotations

import pytest

from broker.policy.rebalance_realized import PRIOR_MOVES, PastMove, kind_of, pays, realization


def past(kind: str, *pairs: tuple[float, float]) -> list[PastMove]:
    return [PastMove(kind, e, r) for e, r in pairs]


@pytest.mark.parametrize(("moves", "kind", "ratio"), [
    ([], "move", 1.0),  # no history: the estimate as it is
    (past("move", (10, 10), (10, 10)), "move", 1.0),
    (past("move", (10, 0)), "move", (0 + PRIOR_MOVES * 10) / (10 + PRIOR_MOVES * 10)),
    (past("move", *[(10, 0)] * 95), "move", PRIOR_MOVES / 100),  # a long record dominates the prior
    (past("move", *[(10, 1)] * 995), "move", (995 + PRIOR_MOVES * 10) / (9950 + PRIOR_MOVES * 10)),
    (past("move", *[(10, 50)] * 20), "move", 1.0),  # never above 1
    (past("move", *[(10, -20)] * 200), "move", 0.0),  # never below 0
    (past("defrag", *[(10, 0)] * 95), "move", 1.0),  # another kind's record does not count
    (past("move", (0, 5), (-3, 1)), "move", 1.0),  # moves expected to save nothing: ignored
])
def test_realization(moves: list[PastMove], kind: str, ratio: float) -> None:
    assert realization(moves, kind) == pytest.approx(ratio)


@pytest.mark.parametrize(("saving", "cost", "ratio", "minimum", "ok"), [
    (100.0, 10.0, 1.0, 1.0, True),
    (100.0, 10.0, 0.05, 1.0, False),  # 5 corrected < 10 cost
    (100.0, 10.0, 0.2, 1.0, True),  # 20 - 10 >= 1
    (100.0, 10.0, 0.105, 1.0, False),  # 10.5 - 10 < min_saving_usd
    (100.0, 10.0, 0.105, 0.0, True),
    (5.0, 5.0, 1.0, 0.0, False),  # saving must exceed the cost
    (100.0, 0.0, 0.0, 0.0, False),  # nothing realized: nothing pays
])
def test_pays(saving: float, cost: float, ratio: float, minimum: float, ok: bool) -> None:
    assert pays(saving, cost, ratio, minimum) is ok


@pytest.mark.parametrize(("a", "b", "kind"), [("p", "p", "defrag"), ("od", "onprem", "move")])
def test_kind_of(a: str, b: str, kind: str) -> None:
    assert kind_of(a, b) == kind

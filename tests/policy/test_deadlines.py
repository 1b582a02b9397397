"""The deadline rule (broker.policy.deadlines): table tests."""

from __future__ import annotations

import math
from typing import Any

import pytest

from broker.policy.deadlines import DeadlineFacts, Where, decide


def facts(**kw: Any) -> DeadlineFacts:
    """Started at 0, deadline at 10,000 s, restart 180 s; 1 step a second unless said."""
    return DeadlineFacts(**{"now": 5000.0, "start": 0.0, "deadline": 10_000.0, "restart_s": 180.0, **kw})


CASES = [
    # name, facts, where, remaining, slack
    ("no progress reported, no expected duration", facts(), Where.SAFE, None, None),
    ("no progress reported, an expected duration: its kept work", facts(expected_s=6000, worked_s=3000),
     Where.CHEAP, 3000, 2000),
    ("progress ahead of the pace", facts(progress=(3000, 6000, 1.0)), Where.CHEAP, 3000, 2000),
    ("progress on the pace exactly", facts(progress=(3000, 6000, 1.0), now=5000.0), Where.CHEAP, 3000, 2000),
    ("progress behind the pace", facts(progress=(2000, 6000, 1.0)), Where.SAFE, 4000, 1000),
    ("behind, counted in steps at its rate", facts(progress=(4000, 12_000, 2.0)), Where.SAFE, 4000, 1000),
    ("too late already", facts(progress=(1000, 6000, 1.0), now=6000.0), Where.LATE, 5000, -1000),
    ("past the deadline", facts(progress=(5990, 6000, 1.0), now=10_001.0), Where.LATE, 10, -11),
    ("ahead, but the slack is one restart: the safety net", facts(progress=(5900, 6000, 1.0), now=9720.0),
     Where.SAFE, 100, 180),
    ("the margin (work since a checkpoint) widens the net",
     facts(progress=(5000, 6000, 1.0), now=8800.0, margin_s=100.0), Where.SAFE, 1000, 200),
    ("on safe capacity, ahead by less than a restart: stays", facts(progress=(3100, 6000, 1.0), on_safe=True),
     Where.SAFE, 2900, 2100),
    ("on safe capacity, ahead by a restart: back to cheap", facts(progress=(3180, 6000, 1.0), on_safe=True),
     Where.CHEAP, 2820, 2180),
    ("progress without a rate yet: the expected duration", facts(progress=(10, 6000, 0.0), expected_s=4000,
                                                                  worked_s=3500), Where.CHEAP, 500, 4500),
    ("progress without a rate and nothing else", facts(progress=(10, 6000, 0.0)), Where.SAFE, None, None),
    ("done steps past the total count as the total", facts(progress=(7000, 6000, 1.0)), Where.CHEAP, 0, 5000),
]


@pytest.mark.parametrize(("name", "f", "where", "remaining", "slack"), CASES, ids=[c[0] for c in CASES])
def test_decide(name: str, f: DeadlineFacts, where: Where, remaining: float | None,
                slack: float | None) -> None:
    d = decide(f)
    assert (d.where, d.remaining_s, d.slack_s) == (where, pytest.approx(remaining),
                                                   pytest.approx(slack)), name
    assert d.reason


@pytest.mark.parametrize(("kw", "field"), [
    ({"deadline": 0.0}, "deadline"), ({"deadline": -5.0}, "deadline"), ({"now": math.nan}, "now"),
    ({"restart_s": -1.0}, "restart_s"), ({"margin_s": math.inf}, "margin_s"),
    ({"worked_s": -2.0}, "worked_s"),
])
def test_bad_facts_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        facts(**kw)

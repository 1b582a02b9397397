"""The checkpoint interval rule (broker.policy.intervals): table tests."""

from __future__ import annotations

import math

import pytest

from broker.policy.intervals import (
    DEFAULT_SAVE_S,
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    PRIOR_HOURS,
    IntervalFacts,
    advise,
    daly,
)

H = 3600.0


def facts(save_s: float | None = 30.0, run_h: float = 0.0, stops: int = 0,
          prior: float = 0.0) -> IntervalFacts:
    return IntervalFacts(save_s=save_s, run_s=run_h * H, stops=stops, prior_rate_per_h=prior)


@pytest.mark.parametrize("name, f, interval, rate, basis", [
    # 1000 h of runs, 1000 stops: M = 1 h; save 30 s: Daly ~ sqrt(2*30*3600) = 465 s (+ terms)
    ("measured, one stop an hour", facts(30, 1000, 1000), daly(30, 3600 * (1000 + PRIOR_HOURS) / 1000),
     1000 / (1000 + PRIOR_HOURS), "measured"),
    ("no save measured: the default save", facts(None, 1000, 1000), daly(DEFAULT_SAVE_S, 3600 * 1024 / 1000),
     1000 / 1024, "default_save"),
    ("nothing stops it, no prior: the upper clamp", facts(30, 500, 0), MAX_INTERVAL_S, 0.0, "no_stops"),
    ("no data at all: default save, upper clamp", facts(None), MAX_INTERVAL_S, 0.0, "default_save+no_stops"),
    ("spot, nothing measured yet: the catalog's rate", facts(30, 0, 0, prior=0.5), daly(30, 7200), 0.5,
     "catalog"),
    ("the prior weighs PRIOR_HOURS of runs", facts(30, PRIOR_HOURS, int(PRIOR_HOURS * 2), prior=0.0),
     daly(30, 3600.0), 1.0, "measured"),
    ("stopped constantly, cheap save: the lower clamp", facts(0.5, 10, 10_000), MIN_INTERVAL_S,
     10_000 / (10 + PRIOR_HOURS), "measured"),
    ("save longer than 2 M: M", facts(600, 1, 1000), 3600 * (1 + PRIOR_HOURS) / 1000,
     1000 / (1 + PRIOR_HOURS), "measured"),
])
def test_advise(name: str, f: IntervalFacts, interval: float, rate: float, basis: str) -> None:
    a = advise(f)
    assert a.interval_s == pytest.approx(min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, interval))), name
    assert a.rate_per_h == pytest.approx(rate), name
    assert a.basis == basis, name


@pytest.mark.parametrize("save, mtbi, expect", [
    (30.0, 3600.0, math.sqrt(2 * 30 * 3600) * (1 + math.sqrt(30 / 7200) / 3 + 30 / 7200 / 9) - 30),
    (0.0, 3600.0, 0.0),
    (100.0, 40.0, 40.0),  # save >= 2 M: M
    (30.0, math.inf, math.inf),
])
def test_daly(save: float, mtbi: float, expect: float) -> None:
    assert daly(save, mtbi) == pytest.approx(expect)


def test_advice_minimises_the_expected_cost() -> None:
    a = advise(facts(60, 200, 100))
    best = a.cost(a.interval_s).total_s_per_h
    for other in (a.interval_s / 2, a.interval_s * 2, 1800.0):
        assert a.cost(other).total_s_per_h > best
    c = a.cost(1800)
    assert c.saving_s_per_h == pytest.approx(3600 * 60 / 1800)
    assert c.lost_s_per_h == pytest.approx(a.rate_per_h * 900)
    assert advise(facts(30)).mtbi_s == math.inf


@pytest.mark.parametrize("kw, field", [
    ({"save_s": -1.0}, "save_s"), ({"save_s": math.nan}, "save_s"),
    ({"save_s": 1.0, "run_s": -5.0}, "run_s"), ({"save_s": 1.0, "run_s": math.inf}, "run_s"),
    ({"save_s": 1.0, "stops": -1}, "stops"), ({"save_s": 1.0, "prior_rate_per_h": -0.1}, "prior_rate_per_h"),
])
def test_bad_facts_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        IntervalFacts(**kw)


def test_cost_refuses_a_zero_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        advise(facts()).cost(0)

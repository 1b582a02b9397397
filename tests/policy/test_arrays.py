"""Arrays and sweeps as pure rules (issue 29): expansion of an array range and a sweep grid,
filling {name} fields, and the throttle of elements running at once."""

from __future__ import annotations

import pytest

from broker.policy.arrays import MAX_ELEMENTS, ArrayRange, Member, fill, parse_array, sweep_grid, throttle


@pytest.mark.parametrize(("text", "want"), [
    ("0-3", ArrayRange((0, 1, 2, 3))),
    ("0-99%10", ArrayRange(tuple(range(100)), 10)),
    ("1,3,7", ArrayRange((1, 3, 7))),
    ("0-8:4,5", ArrayRange((0, 4, 5, 8))),
    ("2-2%1", ArrayRange((2,), 1)),
    (" 0-1 ", ArrayRange((0, 1))),
])
def test_array_ranges(text, want):
    assert parse_array(text) == want


@pytest.mark.parametrize(("text", "says"), [
    ("a-b", "indices like 0-99"),
    ("5-1", "must go up"),
    ("0-9%0", "whole number >= 1"),
    ("0-9%x", "whole number >= 1"),
    ("0-4:0", "must go up"),
    (f"0-{MAX_ELEMENTS}", f"at most {MAX_ELEMENTS}"),
    ("", "indices like 0-99"),
])
def test_bad_array_ranges_say_what_is_allowed(text, says):
    with pytest.raises(ValueError, match=says):
        parse_array(text)


def test_sweep_grid_first_key_slowest():
    assert sweep_grid({"lr": [1e-3, 3e-4], "seed": [0, 1, 2]}) == [
        {"lr": 1e-3, "seed": 0}, {"lr": 1e-3, "seed": 1}, {"lr": 1e-3, "seed": 2},
        {"lr": 3e-4, "seed": 0}, {"lr": 3e-4, "seed": 1}, {"lr": 3e-4, "seed": 2}]


@pytest.mark.parametrize(("grid", "says"), [
    ({}, "at least one field"),
    ({"lr": []}, "lr: needs at least one value"),
    ({"my-lr": [1]}, "not a field name"),
    ({"a": list(range(101)), "b": list(range(100))}, "at most"),
])
def test_bad_sweeps(grid, says):
    with pytest.raises(ValueError, match=says):
        sweep_grid(grid)


@pytest.mark.parametrize(("text", "point", "want"), [
    ("--lr={lr}", {"lr": 0.001}, "--lr=0.001"),
    ("{a}-{b}-{a}", {"a": 1, "b": "x"}, "1-x-1"),
    ("${HOME}/{out}", {"lr": 1}, "${HOME}/{out}"),  # not a field of the sweep: left alone
    ("{flag}", {"flag": True}, "true"),
])
def test_fill(text, point, want):
    assert fill(text, point) == want


def m(array: int, index: int, limit: int | None) -> Member:
    return Member(array, index, limit)


@pytest.mark.parametrize(("pending", "members", "running", "held"), [
    # limit 2, none running: the two lowest indices go through
    ([10, 11, 12, 13], {10: m(10, 0, 2), 11: m(10, 1, 2), 12: m(10, 2, 2), 13: m(10, 3, 2)}, {},
     {12, 13}),
    # one running: one more goes, by index (not by id or queue order)
    ([13, 12, 11], {11: m(10, 1, 2), 12: m(10, 2, 2), 13: m(10, 3, 2)}, {10: 1}, {12, 13}),
    # at the limit: all wait
    ([12, 13], {12: m(10, 2, 2), 13: m(10, 3, 2)}, {10: 2}, {12, 13}),
    # no limit, and plain jobs: never held
    ([5, 20, 21], {20: m(20, 0, None), 21: m(20, 1, None)}, {20: 50}, set()),
    # two arrays counted apart
    ([1, 2, 7, 8], {1: m(1, 0, 1), 2: m(1, 1, 1), 7: m(7, 0, 1), 8: m(7, 1, 1)}, {7: 1}, {2, 7, 8}),
])
def test_throttle(pending, members, running, held):
    out = throttle(pending, members, running)
    assert set(out) == held
    for jid in held:
        assert f"array {members[jid].array_id}:" in out[jid] and "%" in out[jid]
